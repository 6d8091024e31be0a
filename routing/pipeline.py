"""The one answer pipeline. Every interface calls `answer()` and translates its events.

Events, in order: `route`, `token`…, then `done` or `error`. The KB road yields
the stored answer as one token. Generation streams from the first available
target of the matched rule's chain (a named model's endpoint first): a transient
failure before the first token is retried on the same target, a bounded number of
times with backoff, then the next target is tried (`retry_wait`; the policy is in
docs/architecture.md, "Retries and fallback"). A stream that breaks after its first
token is continued from where it was cut, its text sent as an assistant prefill to the
same target or the next that takes one (`continue_answer`); when none can, it ends with an
`error` event (partial=True) so the caller can keep the partial answer.

It runs as an async generator inside the ASGI process: no lock, no Celery hop.
Closing the generator (client gone, Stop) closes the upstream stream at once. The events
themselves are `routing.events`; a local engine that seems gone is reported by
`routing.engine_failures`.

This module chooses the road and the chain (`answer`, `order_targets`, `named_chain`); the rest of
the pipeline, one idea a module: `routing.plan` (the prompt's parts and ceilings, what fits a
target), `routing.chain` (the chain tried in order), `routing.attempt` (one target's try and its
events), `routing.failures` (retries, the breaker's vote, the errors), `routing.continuation` (an
answer cut after its first tokens), `routing.spending` (the reservation and the meter),
`routing.kb_records` (the hits and misses kept for curators).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncGenerator
from typing import NamedTuple

from django.conf import settings

from core import tracing
from knowledge.normalize import normalize
from knowledge.selectors import adirect_answer
from knowledge.verdict import DirectAnswer
from privacy.policy import LOG, REFUSE, ROUTE
from routing.attempt import ms
from routing.chain import generate
from routing.compiled import CompiledRule, Context, Snapshot, Target, named_target
from routing.events import (
    PLAIN,
    Done,
    Error,
    Event,
    KbLookup,
    Passthrough,
    Route,
    RouteRequest,
    Token,
)
from routing.kb_records import record_hit, record_miss
from routing.rules import asnapshot, query_vector
from routing.screening import screen
from spend import ledger
from spend.policy import Spec, apolicies

# The canary draw needs no fresh seed per request (seeding one costs more than the draw).
_rng = random.Random()  # noqa: S311 - a weighted pick of targets, not a secret


def order_targets(rule: CompiledRule, rng: random.Random) -> list[Target]:
    """The chain in the order to try: per position, a weighted draw first (the canary
    split), then the position's other targets, then the next position."""
    ordered: list[Target] = []
    for group in rule.chain:
        remaining = [t for t in group if t.weight > 0]
        while remaining:
            pick = rng.choices(remaining, weights=[t.weight for t in remaining])[0]
            ordered.append(pick)
            remaining.remove(pick)
    return ordered


def named_chain(rule: CompiledRule, named: Target, rng: random.Random) -> list[Target]:
    """The chain of a request that names a model: the endpoint asked for first (not its replica
    group's least busy member), then, unless the rule pins named requests, the rest of the rule's
    chain in its usual order, as fallbacks."""
    first = dataclasses.replace(named, replicas=())
    if rule.pin_named:
        return [first]
    return [first, *(t for t in order_targets(rule, rng) if t.endpoint != named.endpoint)]


@tracing.answer_span
async def answer(
    request: RouteRequest, *, rng: random.Random | None = None
) -> AsyncGenerator[Event, None]:
    """Answer one question by the cheapest good road; see the module docstring for the events."""
    started = time.monotonic()
    rng = rng or _rng
    text = request.text.strip()
    if not normalize(text) and _blank(request.passthrough):
        yield Error(code="empty", message="The question is empty.")
        return
    if len(text) > settings.ROUTING_MAX_INPUT_CHARS:
        yield Error(
            code="too_long",
            message=f"The question has {len(text)} characters; the limit is "
            f"{settings.ROUTING_MAX_INPUT_CHARS}.",
        )
        return
    snap = await rules_for(request)
    if request.model and request.model != "auto":
        # A named model skips the KB, not the rules: the rule that takes this question must
        # list the endpoint, and its prompt, context and limits apply.
        named = await named_route(snap, request, text, rng)
        if isinstance(named, Error):
            yield named
            return
        async for event in generate(
            request,
            text,
            named.rule,
            named.targets,
            started,
            why=named.why,
            rng=rng,
            specs=named.specs,
        ):
            yield event
        return

    direct = None
    if request.passthrough.not_plain is None and normalize(text):
        # Only where a stored text answer satisfies the request (not for tools a model must call,
        # a JSON schema, several choices, an image to look at, a tool result to read).
        lookup = adirect_answer(text, in_conversation=bool(request.history))
        direct = await (tracing.kb_match(lookup) if tracing.ENABLED else lookup)
    if direct is not None and direct.hit:
        entry = direct.entry
        assert entry is not None  # a hit always carries its entry
        yield Route(
            road="kb",
            rule=None,
            target=f"KB#{entry.pk}",
            why=f"knowledge base: {direct.reason}",
            reason="answered from the knowledge base",
        )
        yield Token(text=entry.answer)
        record_hit(request, text, direct, entry.pk)
        elapsed = ms(time.monotonic() - started)
        yield Done(
            road="kb",
            rule=None,
            target=f"KB#{entry.pk}",
            ttft_ms=elapsed,
            latency_ms=elapsed,
            usage=None,
            finish_reason="stop",
            citations=[{"entry_id": entry.pk, "label": entry.citation}],
            kb_entry_id=entry.pk,
            kb=KbLookup.of(direct),
        )
        return

    matched = await matched_rule(snap, request, text, direct)
    if isinstance(matched, Error):
        yield matched
        return
    rule, why, specs = matched
    kb = KbLookup.of(direct) if direct is not None else None
    if rule is None:
        yield Error(
            code="no_route",
            message="No routing rule matches and there is no default rule.",
            kb=kb,
        )
        return
    if rule.action == "kb_only":
        if direct is None:
            yield Error(
                code="model_not_allowed",
                message=f"Rule {rule.name!r} answers from the knowledge base only, and a stored "
                f"answer cannot satisfy this request: {request.passthrough.not_plain}.",
                rule=rule.name,
            )
            return
        yield Route(
            road="kb",
            rule=rule.name,
            target=None,
            why=f"rule {rule.name} is KB-only; {direct.reason}",
            reason="this kind of question is answered from the knowledge base only",
        )
        record_miss(request, text, "", direct)
        yield Token(text=settings.ROUTING_KB_NO_ANSWER)
        elapsed = ms(time.monotonic() - started)
        yield Done(
            road="kb",
            rule=rule.name,
            target=None,
            ttft_ms=elapsed,
            latency_ms=elapsed,
            usage=None,
            finish_reason="stop",
            citations=[],
            kb=kb,
        )
        return
    targets = order_targets(rule, rng)
    if not targets:
        yield Error(
            code="no_target",
            message=f"Rule {rule.name} has no active target.",
            rule=rule.name,
            kb=kb,
        )
        return
    async for event in generate(
        request, text, rule, targets, started, why=why, rng=rng, direct=direct, specs=specs
    ):
        yield event


async def rules_for(request: RouteRequest) -> Snapshot:
    """The compiled rules, and the request's priority class from its groups when its API key
    gave it none."""
    snap = await asnapshot()
    if request.priority is None:
        request.priority = snap.priority_of(request.groups)
    return snap


class Matched(NamedTuple):
    rule: CompiledRule | None
    why: str
    specs: tuple[Spec, ...]


class Named(NamedTuple):
    rule: CompiledRule
    targets: list[Target]
    why: str
    specs: tuple[Spec, ...]


async def matched_rule(
    snap: Snapshot, request: RouteRequest, text: str, direct: DirectAnswer | None
) -> Matched | Error:
    """The rule for this question and the limits it answers to; over a budget that reroutes,
    the refusal when no over-budget rule takes it; a suspected prompt injection's refusal where
    the privacy settings say so."""
    screening = screen(request, snap.privacy)
    action = snap.privacy.injection_action
    if screening.injection:
        request.spent.injection_action = INJECTION_ACTIONS_DONE[action]
    if screening.injection and action == REFUSE:
        return injection_error(screening.injection, direct, routed=False)
    specs, over_budget = await spend_of(request)
    rule, why = await match_rule(snap, request, text, direct, over_budget=over_budget)
    if over_budget and rule is None:
        return budget_spent_error(specs, direct)
    if screening.injection:
        if action == ROUTE and rule is None:
            request.spent.injection_action = "refused"
            return injection_error(screening.injection, direct, routed=True)
        why = f"{why}; suspected prompt injection ({screening.injection}): {action}"
    return Matched(rule, why, specs)


# What the request log says a suspected injection's action did.
INJECTION_ACTIONS_DONE = {LOG: "logged", ROUTE: "routed", REFUSE: "refused"}


def injection_error(kind: str, direct: DirectAnswer | None, *, routed: bool) -> Error:
    return Error(
        code="prompt_injection",
        message=(
            "The question reads as an attempt to override the assistant's instructions "
            f"({kind.replace('_', ' ')}), and "
            + (
                "no rule for such questions takes it."
                if routed
                else "this service does not send such questions to a model."
            )
            + " Ask it in other words."
        ),
        retryable=False,
        kb=KbLookup.of(direct) if direct is not None else None,
    )


async def named_route(
    snap: Snapshot, request: RouteRequest, text: str, rng: random.Random
) -> Named | Error:
    """The chain of a request that names a model (chat and raw completions alike): the model
    must exist and the rule that takes the question must list it; or the refusal."""
    model = request.model
    assert model is not None
    if model not in snap.targets_by_model:
        return Error(code="unknown_model", message=f"No model named {model!r}; see /v1/models.")
    matched = await matched_rule(snap, request, text, None)
    if isinstance(matched, Error):
        return matched
    target, refusal = named_target(matched.rule, model)
    if target is None:
        rule_name = matched.rule.name if matched.rule else None
        return Error(code="model_not_allowed", message=refusal, rule=rule_name)
    assert matched.rule is not None  # a target was found in its chain
    return Named(
        matched.rule,
        named_chain(matched.rule, target, rng),
        f"model {model} requested; {matched.why}",
        matched.specs,
    )


async def spend_of(request: RouteRequest) -> tuple[tuple[Spec, ...], bool]:
    """The limits this request answers to, and whether one of its budgets that reroute is spent
    (a Redis read only when such a budget applies). Asked once a model may answer: a direct
    answer costs nothing and is never counted."""
    specs = (await apolicies()).applying(
        api_key_id=request.api_key_id, user_id=request.user_id, groups=request.groups
    )
    if not any(spec.reroute for spec in specs):
        return specs, False
    return specs, await ledger.aover_budget(specs)


def _blank(passthrough: Passthrough) -> bool:
    """A question with no text is blank unless the client sent the model something else to read:
    an image, a tool result, a conversation without a user turn."""
    if passthrough is PLAIN:
        return True
    question = passthrough.question
    if passthrough.after or question is None:
        return False
    content = question.get("content")
    return not isinstance(content, list) or all(part.get("type") == "text" for part in content)


def budget_spent_error(specs: tuple[Spec, ...], direct: DirectAnswer | None) -> Error:
    spent = ", ".join(spec.label for spec in specs if spec.reroute)
    return Error(
        code="budget_exceeded",
        message=f"The budget of {spent} is spent, and no over-budget rule takes this question.",
        retryable=False,
        kb=KbLookup.of(direct) if direct is not None else None,
    )


async def match_rule(
    snap: Snapshot,
    request: RouteRequest,
    text: str,
    direct: DirectAnswer | None,
    *,
    over_budget: bool = False,
) -> tuple[CompiledRule | None, str]:
    """The rule for this question; over a budget that reroutes, only the over-budget rules."""
    screening = screen(request, snap.privacy)
    ctx = Context(
        text=text,
        groups=request.groups,
        client=request.client,
        model=request.model,
        vector=direct.vector if direct is not None else None,
        over_budget=over_budget,
        personal=screening.personal,
        injection=screening.injection,
    )
    choosing = snap.choose(ctx, lambda: query_vector(text))
    return await (tracing.rule_match(choosing) if tracing.ENABLED else choosing)
