"""The compiled rule set as the pipeline reads it: the targets of a chain, what the rules look at
(`Context`), the rules with their conditions (`CompiledRule.evaluate`), and the snapshot that
chooses the first rule matching a question (`Snapshot.choose`). Built and kept per process by
`routing.rules`; nothing here queries the database.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import re2

from inference_ops.admission import CLASSES
from inference_ops.endpoint_calls import EndpointConfig
from knowledge.normalize import normalize
from privacy.policy import DEFAULT as DEFAULT_PRIVACY
from privacy.policy import ROUTE, Policy
from spend.prices import FREE, Price


@dataclass(frozen=True)
class Target:
    endpoint_id: int
    endpoint: str
    road: str  # local | external
    position: int
    weight: int
    config: EndpointConfig
    context_window: int
    price: Price = FREE
    kind: str = "vllm"  # ModelEndpoint.Kind: which request fields it takes (openai_fields)
    # ModelEndpoint.apis: the /v1 APIs it answers (chat, completions, embeddings)
    apis: frozenset[str] = frozenset({"chat", "completions"})
    replicas: tuple[
        Target, ...
    ] = ()  # the endpoint's replica group, itself included (routing.replicas)
    # It continues an answer cut elsewhere, sent as an assistant prefill (ModelEndpoint).
    accepts_prefill: bool = False
    # The personal data types a question sent here may hold (ModelEndpoint.takes_personal_data):
    # an external endpoint takes none unless an operator says which.
    personal_data: frozenset[str] = frozenset()


@dataclass
class Context:
    """What the rules look at, for one request."""

    text: str
    groups: frozenset[str] = frozenset()
    client: str = "web"
    model: str | None = None
    # the question's embedding, when an intent rule needs it
    vector: tuple[float, ...] | None = None
    # a budget of the caller's that reroutes is spent (spend.ledger.aover_budget)
    over_budget: bool = False
    # what it holds (routing.screening): the personal data types, a suspected injection's kind
    personal: tuple[str, ...] = ()
    injection: str | None = None

    @functools.cached_property
    def normalized(self) -> str:
        return normalize(self.text)  # once per request, not once per keyword of every rule


@dataclass
class CompiledRule:
    id: int
    name: str
    priority: int
    is_default: bool
    action: str
    keywords: tuple[str, ...]
    regex: re2._Regexp | None
    intent_examples: tuple[str, ...]
    intent_vectors: tuple[tuple[float, ...], ...]
    intent_threshold: float
    min_length: int | None
    max_length: int | None
    groups: frozenset[str]
    clients: frozenset[str]
    requested_models: frozenset[str]
    over_budget: bool
    system_prompt: str
    use_kb_context: bool
    context_k: int
    max_tokens: int | None
    temperature: float | None
    chain: tuple[tuple[Target, ...], ...] = field(default_factory=tuple)  # by position
    broken: str = ""  # why the rule can never match (a regex written before RE2 was the engine)
    pin_named: bool = False  # a request naming a model gets no fallback
    # Earlier questions of a stored conversation go with their passages (routing.prompt.History).
    replay_passages: bool = True
    personal_data: str = ""  # "" either | "with" (of personal_data_types, or any) | "without"
    personal_data_types: frozenset[str] = frozenset()
    injection: bool = False  # only a suspected prompt injection
    # An external target that may not receive the question's personal data gets it redacted.
    redact_personal_data: bool = False

    @functools.cached_property
    def intent_matrix(self) -> np.ndarray:
        """The intent examples' vectors as one matrix: a question's scores are one product."""
        return np.asarray(self.intent_vectors, dtype=np.float64)

    @property
    def needs_vector(self) -> bool:
        return bool(self.intent_examples)

    @property
    def takes_every_question(self) -> bool:
        """No condition on the question itself: every question of an admitted caller matches."""
        return self.is_default or not (
            self.keywords
            or self.regex
            or self.broken
            or self.intent_examples
            or self.min_length is not None
            or self.max_length is not None
            or self.requested_models
            or self.over_budget
            or self.personal_data
            or self.injection
        )

    def target_named(self, model: str) -> Target | None:
        """This rule's target for the endpoint a client named, when its chain lists it with a
        share."""
        for group in self.chain:
            for target in group:
                if target.endpoint == model and target.weight > 0:
                    return target
        return None

    def evaluate(self, ctx: Context, *, intent: bool = True) -> tuple[bool, list[str]]:
        """(matched, one line per condition saying why). With `intent=False` the intent
        condition is left out: whether the rule could match at all, before paying for a vector."""
        if self.is_default:
            return True, ["default rule: catches everything"]
        if self.broken:
            return False, ["✗ " + self.broken]
        reasons, matched = [], True

        def check(ok: bool, why: str):
            nonlocal matched
            matched = matched and ok
            reasons.append(("✓ " if ok else "✗ ") + why)

        if self.keywords:
            hits = [k for k in self.keywords if k in ctx.normalized]
            check(bool(hits), f"keywords: {', '.join(hits)}" if hits else "keywords: none present")
        if self.regex is not None:
            found = self.regex.search(ctx.text)
            check(
                found is not None,
                f"regex /{self.regex.pattern}/ " + ("matches" if found else "does not match"),
            )
        if self.intent_examples and intent:
            if not self.intent_vectors or ctx.vector is None:
                # Never a match by default: an intent rule without vectors would take everything.
                check(False, "intent: no embedding model serving")
            elif len(ctx.vector) != len(self.intent_vectors[0]):
                check(False, "intent: the embedding model changed since the rules were compiled")
            else:
                scores = self.intent_matrix @ np.asarray(ctx.vector, dtype=np.float64)
                best = int(scores.argmax())
                score = float(scores[best])
                check(
                    score >= self.intent_threshold,
                    f"intent: {score:.3f} to {self.intent_examples[best]!r} "
                    f"({'≥' if score >= self.intent_threshold else '<'} "
                    f"{self.intent_threshold:.2f})",
                )
        length = len(ctx.text)
        if self.min_length is not None:
            check(
                length >= self.min_length,
                f"length {length} {'≥' if length >= self.min_length else '<'} {self.min_length}",
            )
        if self.max_length is not None:
            check(
                length <= self.max_length,
                f"length {length} {'≤' if length <= self.max_length else '>'} {self.max_length}",
            )
        if self.groups:
            shared = self.groups & ctx.groups
            check(
                bool(shared),
                f"group: {', '.join(sorted(shared))}"
                if shared
                else f"group: user is in none of {', '.join(sorted(self.groups))}",
            )
        if self.clients:
            check(
                ctx.client in self.clients,
                f"client {ctx.client!r} "
                + (
                    "listed"
                    if ctx.client in self.clients
                    else f"not in {', '.join(sorted(self.clients))}"
                ),
            )
        if self.requested_models:
            ok = ctx.model in self.requested_models
            check(ok, f"requested model {ctx.model!r} " + ("listed" if ok else "not listed"))
        if self.over_budget:
            check(ctx.over_budget, "budget spent" if ctx.over_budget else "budget not spent")
        if self.personal_data:
            self._personal_data(ctx, check)
        if self.injection:
            check(
                ctx.injection is not None,
                f"suspected prompt injection ({ctx.injection})"
                if ctx.injection
                else "no suspected prompt injection",
            )
        if not reasons:
            check(True, "no conditions: matches everything")
        return matched, reasons

    def _personal_data(self, ctx: Context, check: Callable[[bool, str], None]) -> None:
        """The personal data condition: the types are named, never the values."""
        held = [
            kind
            for kind in ctx.personal
            if not self.personal_data_types or kind in self.personal_data_types
        ]
        if self.personal_data == "without":
            check(
                not ctx.personal,
                f"holds personal data ({', '.join(ctx.personal)})"
                if ctx.personal
                else "holds no personal data",
            )
        else:
            wanted = ", ".join(sorted(self.personal_data_types)) or "any type"
            check(
                bool(held),
                f"holds personal data ({', '.join(held)})"
                if held
                else f"holds no personal data of {wanted}",
            )


@dataclass
class Snapshot:
    rules: tuple[CompiledRule, ...]
    targets_by_model: dict[str, Target]  # `model` names a client may force, for /v1
    # Group name -> its priority class at an endpoint's capacity (routing.models.GroupPriority).
    group_priorities: dict[str, str] = field(default_factory=dict)
    # What the screening looks for and does (privacy.policy; PrivacySettings in the admin).
    privacy: Policy = DEFAULT_PRIVACY

    def priority_of(self, groups: frozenset[str]) -> str | None:
        """The best priority class of these groups, None when none has one."""
        classes = [self.group_priorities[g] for g in groups if g in self.group_priorities]
        return min(classes, key=CLASSES.index) if classes else None

    def class_of(
        self, *, own: str | None, groups: frozenset[str], api_key: bool
    ) -> tuple[str, str]:
        """A request's priority class at an endpoint's capacity, and where it comes from ("key",
        "groups" or "default"): its API key's own class, else its groups' best, else the default
        (api for a key, interactive for a person), as the pipeline's admission ticket takes it."""
        if own:
            return own, "key"
        group = self.priority_of(groups)
        if group:
            return group, "groups"
        return ("api" if api_key else "interactive"), "default"

    async def choose(
        self, ctx: Context, vector: Callable[[], Awaitable[tuple[float, ...] | None]]
    ) -> tuple[CompiledRule | None, str]:
        """The first rule that matches, and why. The question's vector is asked for only when
        an intent rule's other conditions hold, so a question that no intent rule could take
        costs no embedding."""
        asked = ctx.vector is not None
        for rule in self.rules:
            if ctx.over_budget and not rule.over_budget:
                continue  # over a budget that reroutes, only the rules written for it
            if ctx.injection and not rule.injection and self.privacy.injection_action == ROUTE:
                continue  # a suspected injection, routed: only the rules written for it
            if rule.needs_vector and not asked and rule.evaluate(ctx, intent=False)[0]:
                ctx.vector, asked = await vector(), True
            matched, reasons = rule.evaluate(ctx)
            if matched:
                return rule, f"rule {rule.name}: " + "; ".join(r.lstrip("✓ ") for r in reasons)
        return None, ""

    def nameable(self, *, groups: frozenset[str], client: str) -> list[str]:
        """The endpoints this caller may name on /v1, for the model list: the chains of the rules
        that admit the caller (groups, clients), down to the first that takes every question.
        The rule that matches a question still decides; this is the list to show."""
        names: set[str] = set()
        for rule in self.rules:
            if (
                rule.broken
                or (rule.groups and not rule.groups & groups)
                or (rule.clients and client not in rule.clients)
            ):
                continue
            listed = {t.endpoint for group in rule.chain for t in group if t.weight > 0}
            if rule.action != "generate":
                listed = set()
            if rule.requested_models:
                listed &= rule.requested_models
            names |= listed
            if rule.takes_every_question:
                break
        return sorted(names & self.targets_by_model.keys())


def named_target(rule: CompiledRule | None, model: str) -> tuple[Target | None, str]:
    """The target a client names as `model` for a question the rule `rule` takes, and "", or
    None and why it may not name it. The policy: a named model is allowed where the rule that
    routes the question lists it."""
    if rule is None:
        return None, (
            f"No routing rule takes this question, so no model may be named for it ({model!r})."
        )
    if rule.action != "generate":
        return None, (
            f"Rule {rule.name!r} answers this question from the knowledge base only; "
            f"{model!r} may not be named."
        )
    target = rule.target_named(model)
    if target is None:
        allowed = sorted({t.endpoint for group in rule.chain for t in group if t.weight > 0})
        return None, f"Rule {rule.name!r} routes this question and does not list {model!r}" + (
            f"; it allows: {', '.join(allowed)}, or auto." if allowed else "; use auto."
        )
    return target, ""
