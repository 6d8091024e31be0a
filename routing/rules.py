"""The active rule set, compiled once per process and matched without a database query.

`asnapshot()` returns the compiled rules. A change to rules, targets or endpoints
bumps a version in Redis (after commit); each process compares versions at most
once a second and rebuilds when they differ, so a request never queries the rule
tables.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import numpy as np
import re2
from django.conf import settings

from core.versioned import Versioned
from inference_ops.admission import CLASSES
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.models import EngineProcess, ModelEndpoint
from knowledge.embedding import embed_texts, spec_of
from knowledge.normalize import normalize
from knowledge.selectors import aquery_vector, serving_model
from routing.exceptions import RuleInvalid
from routing.models import GroupPriority, RouteTarget, RoutingRule
from routing.validation import regex_compile
from spend.policy import POLICIES
from spend.prices import FREE, Price

logger = logging.getLogger(__name__)

VERSION_KEY = "routing:rules:version"
_REBUILD_EVERY = 300.0  # also catches what no signal reports, e.g. a KB embedding-model switch


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
        if not reasons:
            check(True, "no conditions: matches everything")
        return matched, reasons


@dataclass
class Snapshot:
    rules: tuple[CompiledRule, ...]
    targets_by_model: dict[str, Target]  # `model` names a client may force, for /v1
    # Group name -> its priority class at an endpoint's capacity (routing.models.GroupPriority).
    group_priorities: dict[str, str] = field(default_factory=dict)

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


# --- building -------------------------------------------------------------------------------------


def _target(
    t: RouteTarget,
    groups: dict[str, list] | None = None,
    prioritized: frozenset[int] = frozenset(),
) -> Target:
    def one(endpoint) -> Target:
        config = EndpointConfig.from_endpoint(endpoint)
        if endpoint.pk in prioritized:
            config = replace(config, priority_scheduling=True)
        if t.lora_adapter:
            config = EndpointConfig(**{**config.__dict__, "model": t.lora_adapter})
        return Target(
            endpoint_id=endpoint.pk,
            endpoint=endpoint.name,
            road=endpoint.road,
            position=t.position,
            weight=t.weight,
            config=config,
            context_window=endpoint.context_window,
            price=Price.of(endpoint),
            kind=endpoint.kind,
            apis=frozenset(endpoint.apis),
            accepts_prefill=endpoint.continues_answers,
        )

    target = one(t.endpoint)
    members = (groups or {}).get(t.endpoint.replica_group) if t.endpoint.replica_group else None
    if members and len(members) > 1:
        target = replace(target, replicas=tuple(one(member) for member in members))
    return target


def _intent_vectors(examples: list[str]) -> tuple[tuple[float, ...], ...]:
    if not examples:
        return ()
    model = serving_model()
    if model is None:
        return ()
    return tuple(tuple(v) for v in embed_texts(spec_of(model), examples))


def _priority_scheduled() -> frozenset[int]:
    """The endpoints an engine row of which runs vLLM's priority scheduling (its extra arguments
    say `--scheduling-policy priority`): their requests carry the priority class as vLLM's
    `priority`, which the default first-come policy would refuse."""
    found = set()
    for endpoint_id, args in EngineProcess.objects.values_list("endpoint_id", "extra_args"):
        args = [str(a) for a in args or ()]
        for index, arg in enumerate(args):
            if arg == "--scheduling-policy=priority" or (
                arg == "--scheduling-policy" and args[index + 1 : index + 2] == ["priority"]
            ):
                found.add(endpoint_id)
    return frozenset(found)


def snapshot_build() -> Snapshot:
    rules = []
    queryset = (
        RoutingRule.objects.filter(active=True)
        .prefetch_related("groups", "targets__endpoint")
        .order_by("is_default", "priority", "pk")
    )
    groups: dict[str, list] = {}
    for member in (
        ModelEndpoint.objects.filter(active=True).exclude(replica_group="").order_by("name")
    ):
        groups.setdefault(member.replica_group, []).append(member)
    prioritized = _priority_scheduled()
    for rule in queryset:
        targets = [_target(t, groups, prioritized) for t in rule.targets.all() if t.endpoint.active]
        pattern, broken = None, ""
        if rule.regex:
            try:
                pattern = regex_compile(rule.regex)
            except RuleInvalid as exc:
                broken = (
                    f"regex /{rule.regex}/ {exc.errors['regex']}: "
                    "the rule never matches until it is fixed"
                )
                logger.error("routing rule %r: %s", rule.name, broken)
        positions = sorted({t.position for t in targets})
        chain = tuple(tuple(t for t in targets if t.position == p) for p in positions)
        rules.append(
            CompiledRule(
                id=rule.pk,
                name=rule.name,
                priority=rule.priority,
                is_default=rule.is_default,
                action=rule.action,
                keywords=tuple(k for k in (normalize(k) for k in rule.keywords) if k),
                regex=pattern,
                broken=broken,
                intent_examples=tuple(rule.intent_examples),
                intent_vectors=_intent_vectors(rule.intent_examples),
                intent_threshold=rule.intent_threshold,
                min_length=rule.min_length,
                max_length=rule.max_length,
                groups=frozenset(g.name for g in rule.groups.all()),
                clients=frozenset(rule.clients),
                requested_models=frozenset(rule.requested_models),
                over_budget=rule.over_budget,
                system_prompt=rule.system_prompt,
                use_kb_context=rule.use_kb_context,
                context_k=rule.context_k,
                max_tokens=rule.max_tokens,
                temperature=rule.temperature,
                chain=chain,
                pin_named=rule.pin_named,
                replay_passages=rule.replay_passages,
            )
        )
    targets_by_model: dict[str, Target] = {}
    for endpoint in ModelEndpoint.objects.filter(active=True).order_by("name"):
        target = Target(
            endpoint_id=endpoint.pk,
            endpoint=endpoint.name,
            road=endpoint.road,
            position=1,
            weight=1,
            config=EndpointConfig.from_endpoint(endpoint),
            context_window=endpoint.context_window,
            price=Price.of(endpoint),
            kind=endpoint.kind,
            apis=frozenset(endpoint.apis),
            accepts_prefill=endpoint.continues_answers,
        )
        targets_by_model.setdefault(endpoint.name, target)
    return Snapshot(
        rules=tuple(rules),
        targets_by_model=targets_by_model,
        group_priorities=dict(GroupPriority.objects.values_list("group__name", "priority")),
    )


_snapshots: Versioned[Snapshot] = Versioned(
    key=VERSION_KEY,
    build=lambda: snapshot_build(),
    check_every=lambda: settings.ROUTING_RULES_CHECK_SECONDS,
    what="the routing rules",
    rebuild_every=_REBUILD_EVERY,
    # The pipeline asks for the spend limits right after the rules: one check for both.
    followers=(POLICIES,),
)


def snapshot() -> Snapshot:
    return _snapshots.get()


async def asnapshot() -> Snapshot:
    return await _snapshots.aget()


def rules_changed() -> None:
    """Tell every process to rebuild its rule set (called after commit)."""
    _snapshots.changed()


async def query_vector(text: str) -> tuple[float, ...] | None:
    """The question's embedding with the KB's serving model (from the query cache when seen)."""
    found = await aquery_vector(text)
    return found[1] if found else None
