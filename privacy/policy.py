"""What the screening looks for and what it does, as an operator set it (`PrivacySettings` in the
admin): the personal data types on and their thresholds, what a suspected prompt injection does,
whether KB passages are screened too. The routing snapshot holds the current `Policy` (it is
rebuilt when the row changes, as the rules are); nothing here queries the database at request
time. `Screening` is what one request was found to hold under a policy (routing.screening reads
it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from privacy.detector import THRESHOLD, TYPES

# What a question screening flags as a prompt injection does (PrivacySettings.injection_action).
LOG = "log"  # noted in the route's reason and the request log; the rules route it as usual
ROUTE = "route"  # only a rule written for it (its "suspected prompt injection" condition) takes it
REFUSE = "refuse"  # a 400 that says why; no model reads it
INJECTION_ACTIONS = (LOG, ROUTE, REFUSE)


@dataclass(frozen=True)
class Policy:
    types: frozenset[str] = frozenset(TYPES)
    # Per type, the score a finding needs (privacy.detector.THRESHOLD where none is set).
    thresholds: tuple[tuple[str, float], ...] = ()
    injection_action: str = LOG
    screen_passages: bool = True
    threshold_of: Mapping[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "threshold_of", dict(self.thresholds))

    def threshold(self, kind: str) -> float:
        return self.threshold_of.get(kind, THRESHOLD)

    @classmethod
    def of(cls, types, thresholds: Mapping[str, float], injection_action: str, passages: bool):
        return cls(
            types=frozenset(kind for kind in types if kind in TYPES),
            thresholds=tuple(
                sorted((kind, float(value)) for kind, value in thresholds.items() if kind in TYPES)
            ),
            injection_action=injection_action if injection_action in INJECTION_ACTIONS else LOG,
            screen_passages=passages,
        )


DEFAULT = Policy()


@dataclass(frozen=True, slots=True)
class Screening:
    """What one request holds that decides where it may go, read under `policy`."""

    personal: tuple[str, ...] = ()  # the types found, sorted
    injection: str | None = None  # a suspected injection's kind (privacy.injection.KINDS)
    policy: Policy = DEFAULT  # the one it was read with: its types redact, its passages setting
