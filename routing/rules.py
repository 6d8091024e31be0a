"""The active rule set, compiled once per process and matched without a database query.

`asnapshot()` returns the compiled rules. A change to rules, targets or endpoints
bumps a version in Redis (after commit); each process compares versions at most
once a second and rebuilds when they differ, so a request never queries the rule
tables. What the snapshot holds, and how it matches a question: `routing.compiled`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from django.conf import settings

from core.versioned import Versioned
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.models import EngineProcess, ModelEndpoint
from knowledge.embedding import embed_texts, spec_of
from knowledge.normalize import normalize
from knowledge.selectors import aquery_vector, serving_model
from privacy.models import current_policy
from routing.compiled import CompiledRule, Snapshot, Target
from routing.exceptions import RuleInvalid
from routing.models import GroupPriority, RouteTarget, RoutingRule
from routing.validation import regex_compile
from spend.policy import POLICIES
from spend.prices import Price

logger = logging.getLogger(__name__)

VERSION_KEY = "routing:rules:version"
_REBUILD_EVERY = 300.0  # also catches what no signal reports, e.g. a KB embedding-model switch


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
            personal_data=endpoint.takes_personal_data,
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
                personal_data=rule.personal_data,
                personal_data_types=frozenset(rule.personal_data_types),
                injection=rule.injection,
                redact_personal_data=rule.redact_personal_data,
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
            personal_data=endpoint.takes_personal_data,
        )
        targets_by_model.setdefault(endpoint.name, target)
    return Snapshot(
        rules=tuple(rules),
        targets_by_model=targets_by_model,
        group_priorities=dict(GroupPriority.objects.values_list("group__name", "priority")),
        privacy=current_policy(),
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
