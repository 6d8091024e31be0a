"""The limits in force, compiled once per process and read without a database query.

A change to a Limit row bumps a version in Redis (after commit); each process compares versions
at most once per ROUTING_RULES_CHECK_SECONDS and rebuilds when they differ, as the routing rules
do (core.versioned). A request asks `applying(...)`: the limits of its API key, its user and its
user's groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Q

from core.versioned import Versioned
from spend.models import Limit
from spend.prices import micros

VERSION_KEY = "spend:limits:version"


@dataclass(frozen=True, slots=True)
class Spec:
    """One subject's limits, as the ledger counts them."""

    kind: str  # key | user | group
    ident: str  # the key's or user's id, the group's name
    label: str  # as operators and users read it: "API key ci", "user alice", "group support"
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    budget_micros: int | None = None
    budget_period: str = "month"  # day | month (Limit.Period)
    warn_at: float = 0.8
    reroute: bool = False  # over budget: route by the over-budget rules instead of refusing

    @property
    def subject(self) -> str:
        return f"{self.kind}:{self.ident}"


@dataclass(frozen=True)
class Policies:
    keys: dict[int, Spec] = field(default_factory=dict)
    users: dict[int, Spec] = field(default_factory=dict)
    groups: dict[str, Spec] = field(default_factory=dict)

    def applying(
        self, *, api_key_id: int | None, user_id: int | None, groups: frozenset[str]
    ) -> tuple[Spec, ...]:
        """Every limit a request answers to: its key's, its user's, its groups' (sorted, so the
        same request always checks them in the same order)."""
        found = []
        if api_key_id is not None and (spec := self.keys.get(api_key_id)) is not None:
            found.append(spec)
        if user_id is not None and (spec := self.users.get(user_id)) is not None:
            found.append(spec)
        if self.groups and groups:
            found += [self.groups[name] for name in sorted(groups) if name in self.groups]
        return tuple(found)


def spec_of(row: Limit) -> Spec:
    # A limit has exactly one subject (Limit.clean and its check constraint): the one whose id is
    # set is there, hence the ignores.
    if row.api_key_id:
        kind, ident, label = "key", str(row.api_key_id), f"API key {row.api_key.name}"  # type: ignore[union-attr]
    elif row.user_id:
        kind, ident, label = "user", str(row.user_id), f"user {row.user.get_username()}"  # type: ignore[union-attr]
    else:
        kind, ident, label = "group", row.group.name, f"group {row.group.name}"  # type: ignore[union-attr]
    return Spec(
        kind=kind,
        ident=ident,
        label=label,
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
        tokens_per_day=row.tokens_per_day,
        budget_micros=None if row.budget is None else micros(float(row.budget)),
        budget_period=row.budget_period,
        warn_at=row.warn_at,
        reroute=row.over_budget == Limit.OverBudget.REROUTE,
    )


def policies_build() -> Policies:
    policies = Policies()
    # A revoked key's limit is kept (its history) but applies to nothing.
    rows = Limit.objects.select_related("api_key", "user", "group").filter(
        Q(api_key__isnull=True) | Q(api_key__revoked_at__isnull=True)
    )
    for row in rows:
        spec = spec_of(row)
        # spec_of chose the kind by which id is set.
        if spec.kind == "key":
            policies.keys[row.api_key_id] = spec  # type: ignore[index]
        elif spec.kind == "user":
            policies.users[row.user_id] = spec  # type: ignore[index]
        else:
            policies.groups[spec.ident] = spec
    return policies


POLICIES: Versioned[Policies] = Versioned(
    key=VERSION_KEY,
    build=lambda: policies_build(),
    check_every=lambda: settings.ROUTING_RULES_CHECK_SECONDS,
    what="the spend limits",
)


def policies() -> Policies:
    return POLICIES.get()


async def apolicies() -> Policies:
    return await POLICIES.aget()


def limits_changed() -> None:
    """Tell every process to rebuild its limits (called after commit)."""
    POLICIES.changed()
