"""The one answer pipeline. Every interface calls `answer()` and translates its events.

Events, in order: `route`, `token`…, then `done` or `error`. The KB road yields
the stored answer as one token. Generation streams from the first available
target of the matched rule's chain: a failure before the first token moves on to
the next target; after the first token the pipeline never switches and ends with
an `error` event (partial=True) so the caller can keep the partial answer.

It runs as an async generator inside the ASGI process: no lock, no Celery hop.
Closing the generator (client gone, Stop) closes the upstream stream at once. The events
themselves are `routing.events`; a local engine that seems gone is reported by
`routing.engine_failures`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncGenerator

from django.conf import settings

from core import tracing
from inference_ops.client import Finish, stream_chat
from inference_ops.exceptions import EngineError
from knowledge.hits import hit_note
from knowledge.misses import miss_note
from knowledge.normalize import normalize
from knowledge.selectors import acontext_passages, adirect_answer
from knowledge.verdict import DirectAnswer
from routing import breaker, replicas
from routing.engine_failures import ENGINE_GONE, report_engine_failure
from routing.events import (
    Done,
    Error,
    Event,
    KbLookup,
    Route,
    RouteRequest,
    Spent,
    Token,
    route_event,
    usage_of,
)
from routing.prompt import (
    approx_tokens,
    build_messages,
    message_tokens,
    passages_block,
    system_message,
)
from routing.rules import (
    CompiledRule,
    Context,
    Snapshot,
    Target,
    asnapshot,
    named_target,
    query_vector,
)
from spend import ledger
from spend.policy import Spec, apolicies

# The canary draw needs no fresh seed per request (seeding one costs more than the draw).
_rng = random.Random()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


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


@tracing.answer_span
async def answer(
    request: RouteRequest, *, rng: random.Random | None = None
) -> AsyncGenerator[Event, None]:
    """Answer one question by the cheapest good road; see the module docstring for the events."""
    started = time.monotonic()
    rng = rng or _rng
    text = request.text.strip()
    if not normalize(text):
        yield Error(code="empty", message="The question is empty.")
        return
    if len(text) > settings.ROUTING_MAX_INPUT_CHARS:
        yield Error(
            code="too_long",
            message=f"The question has {len(text)} characters; the limit is "
            f"{settings.ROUTING_MAX_INPUT_CHARS}.",
        )
        return
    snap = await asnapshot()

    if request.model and request.model != "auto":
        # A named model skips the KB, not the rules: the rule that takes this question must
        # list the endpoint, and its prompt, context and limits apply.
        if request.model not in snap.targets_by_model:
            yield Error(
                code="unknown_model", message=f"No model named {request.model!r}; see /v1/models."
            )
            return
        specs, over_budget = await _spend_of(request)
        rule, why = await _match(snap, request, text, None, over_budget=over_budget)
        if over_budget and rule is None:
            yield _over_budget(specs, None)
            return
        target, refusal = named_target(rule, request.model)
        if target is None:
            yield Error(code="model_not_allowed", message=refusal, rule=rule.name if rule else None)
            return
        # The endpoint asked for, not its replica group's least busy member.
        named = dataclasses.replace(target, replicas=())
        async for event in _generate(
            request,
            text,
            rule,
            [named],
            started,
            why=f"model {request.model} requested; {why}",
            rng=rng,
            specs=specs,
        ):
            yield event
        return

    lookup = adirect_answer(text, in_conversation=bool(request.history))
    direct = await (tracing.kb_match(lookup) if tracing.ENABLED else lookup)
    if direct.hit:
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
        _record_hit(request, text, direct, entry.pk)
        elapsed = _ms(time.monotonic() - started)
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

    specs, over_budget = await _spend_of(request)
    rule, why = await _match(snap, request, text, direct, over_budget=over_budget)
    if over_budget and rule is None:
        yield _over_budget(specs, direct)
        return
    if rule is None:
        yield Error(
            code="no_route",
            message="No routing rule matches and there is no default rule.",
            kb=KbLookup.of(direct),
        )
        return
    if rule.action == "kb_only":
        yield Route(
            road="kb",
            rule=rule.name,
            target=None,
            why=f"rule {rule.name} is KB-only; {direct.reason}",
            reason="this kind of question is answered from the knowledge base only",
        )
        _record_miss(request, text, "", direct)
        yield Token(text=settings.ROUTING_KB_NO_ANSWER)
        elapsed = _ms(time.monotonic() - started)
        yield Done(
            road="kb",
            rule=rule.name,
            target=None,
            ttft_ms=elapsed,
            latency_ms=elapsed,
            usage=None,
            finish_reason="stop",
            citations=[],
            kb=KbLookup.of(direct),
        )
        return
    targets = order_targets(rule, rng)
    if not targets:
        yield Error(
            code="no_target",
            message=f"Rule {rule.name} has no active target.",
            rule=rule.name,
            kb=KbLookup.of(direct),
        )
        return
    async for event in _generate(
        request, text, rule, targets, started, why=why, rng=rng, direct=direct, specs=specs
    ):
        yield event


async def _spend_of(request: RouteRequest) -> tuple[tuple[Spec, ...], bool]:
    """The limits this request answers to, and whether one of its budgets that reroute is spent
    (a Redis read only when such a budget applies). Asked once a model may answer: a direct
    answer costs nothing and is never counted."""
    specs = (await apolicies()).applying(
        api_key_id=request.api_key_id, user_id=request.user_id, groups=request.groups
    )
    if not any(spec.reroute for spec in specs):
        return specs, False
    return specs, await ledger.aover_budget(specs)


def _over_budget(specs: tuple[Spec, ...], direct: DirectAnswer | None) -> Error:
    spent = ", ".join(spec.label for spec in specs if spec.reroute)
    return Error(
        code="budget_exceeded",
        message=f"The budget of {spent} is spent, and no over-budget rule takes this question.",
        retryable=False,
        kb=KbLookup.of(direct) if direct is not None else None,
    )


async def _match(
    snap: Snapshot,
    request: RouteRequest,
    text: str,
    direct: DirectAnswer | None,
    *,
    over_budget: bool = False,
) -> tuple[CompiledRule | None, str]:
    """The rule for this question; over a budget that reroutes, only the over-budget rules."""
    ctx = Context(
        text=text,
        groups=request.groups,
        client=request.client,
        model=request.model,
        vector=direct.vector if direct is not None else None,
        over_budget=over_budget,
    )
    choosing = snap.choose(ctx, lambda: query_vector(text))
    return await (tracing.rule_match(choosing) if tracing.ENABLED else choosing)


async def _generate(
    request: RouteRequest,
    text: str,
    rule: CompiledRule | None,
    targets: list[Target],
    started: float,
    *,
    why: str,
    rng: random.Random,
    direct: DirectAnswer | None = None,
    specs: tuple[Spec, ...] = (),
) -> AsyncGenerator[Event, None]:
    rule_name = rule.name if rule else None
    named = bool(request.model) and request.model != "auto"
    max_tokens = answer_budget(request.max_tokens, rule)
    temperature = (
        request.temperature
        if request.temperature is not None
        else (rule.temperature if rule else None)
    )
    passages = []
    if rule is not None and rule.use_kb_context:
        query = (
            (direct.model, direct.vector)
            if direct is not None and direct.model is not None and direct.vector is not None
            else None
        )
        passages = await acontext_passages(text, k=rule.context_k, query=query)
    prompt = (rule.system_prompt if rule else "") or settings.ROUTING_SYSTEM_PROMPT
    if request.system:
        prompt = f"{prompt}\n\n{request.system}"
    system = system_message(prompt, with_passages=rule is not None and rule.use_kb_context)
    context = passages_block(passages)
    citations = [{"entry_id": p.entry_id, "label": p.label} for p in passages]

    kb = KbLookup.of(direct) if direct is not None else None
    system_cost = message_tokens({"content": system}) + approx_tokens(context)
    reservation = None
    if specs:
        # The prompt as if no history were left out (so never under the real one), and the
        # answer's ceiling; priced at the dearest target that may answer.
        prompt = system_cost + approx_tokens(text) + sum(map(message_tokens, request.history))
        booked = await ledger.areserve(
            specs,
            tokens=prompt + max_tokens,
            cost=max(t.price.cost(prompt, max_tokens) for t in targets),
        )
        if isinstance(booked, ledger.Refusal):
            yield Error(
                code=booked.code,
                message=booked.message,
                retryable=booked.retry_after is not None,
                retry_after=booked.retry_after,
                rule=rule_name,
                kb=kb,
                standing=booked.standing,
            )
            return
        reservation = booked
    meter = _Meter(request.spent)
    standing = reservation.standing if reservation else None
    try:
        attempts: list[str] = []
        passed: list[str] = []  # endpoints passed over before the one that answers
        skipped: list[str] = []  # endpoints the breaker kept closed to this request
        last_error: EngineError | None = None
        too_long: Error | None = None
        targets = replicas.expand(targets, replicas.affinity_of(request.history, text))
        for target in targets:
            budget = target.context_window - max_tokens
            if approx_tokens(text) + system_cost + 8 > budget:
                attempts.append(
                    f"{target.endpoint}: the question does not fit its "
                    f"{target.context_window}-token window"
                )
                too_long = too_long or Error(
                    code="too_long",
                    rule=rule_name,
                    target=target.endpoint,
                    road=target.road,
                    message=(
                        f"The question is about {approx_tokens(text)} tokens; "
                        f"{target.endpoint} accepts at most "
                        f"{target.context_window} tokens, {max_tokens} of them kept for the answer."
                    ),
                )
                continue
            # Counted before the breaker's check (which may wait on Redis), so the requests picking
            # a replica meanwhile see this one.
            replicas.started(target.endpoint_id)
            try:
                allowed = await breaker.allow(target.endpoint)
            except BaseException:  # cancelled while asking: counted no longer
                replicas.ended(target.endpoint_id)
                raise
            if not allowed:
                replicas.ended(target.endpoint_id)
                attempts.append(f"{target.endpoint}: circuit open or resting after a Retry-After")
                skipped.append(target.endpoint)
                passed.append(target.endpoint)
                continue
            messages, dropped = build_messages(
                system=system,
                history=request.history,
                question=text,
                budget=budget,
                passages=context,
            )
            produced = False
            ttft: float | None = None
            answer_text: list[str] = []
            meter.begin(target, messages, answer_text)
            chat = (
                tracing.Chat(
                    model=target.config.model,
                    base_url=target.config.base_url,
                    max_tokens=max_tokens,
                    temperature=temperature,
                )
                if tracing.ENABLED
                else None
            )
            try:
                extra_body = (
                    {"ignore_eos": True} if request.ignore_eos and target.road == "local" else None
                )
                async with contextlib.aclosing(
                    stream_chat(
                        target.config,
                        messages,
                        max_tokens=max_tokens,
                        temperature=temperature,
                        extra_body=extra_body,
                    )
                ) as stream:
                    async for event in stream:
                        if isinstance(event, Finish):
                            if chat:
                                chat.finished(event.finish_reason, event.usage)
                            await breaker.success(target.endpoint)
                            meter.finish(event)
                            if not produced:
                                ttft = _ms(time.monotonic() - started)
                                yield route_event(
                                    target,
                                    rule_name,
                                    why,
                                    attempts,
                                    dropped,
                                    named=named,
                                    engine_ms=_ms(event.total),
                                    standing=standing,
                                )
                            if direct is not None:
                                _record_miss(request, text, "".join(answer_text), direct)
                            yield Done(
                                road=target.road,
                                rule=rule_name,
                                target=target.endpoint,
                                ttft_ms=ttft,
                                latency_ms=_ms(time.monotonic() - started),
                                usage=usage_of(event),
                                finish_reason=event.finish_reason,
                                citations=citations,
                                engine_ms=_ms(event.total),
                                kb=kb,
                                fell_back_from=tuple(passed),
                            )
                            return
                        if not produced:
                            produced = True
                            if chat:
                                chat.first_chunk(event.elapsed)
                            ttft = _ms(time.monotonic() - started)
                            yield route_event(
                                target,
                                rule_name,
                                why,
                                attempts,
                                dropped,
                                named=named,
                                engine_ms=_ms(event.elapsed),
                                standing=standing,
                            )
                        answer_text.append(event.text)
                        yield Token(text=event.text)
            except EngineError as exc:
                if chat:
                    chat.failed(exc.kind)
                if exc.retry_after is not None:
                    await breaker.rest(target.endpoint, exc.retry_after)
                    skipped.append(target.endpoint)
                elif exc.retryable:
                    await breaker.failure(target.endpoint)
                if exc.kind in ENGINE_GONE and target.road == "local":
                    report_engine_failure(target.endpoint_id)
                if produced or exc.produced_tokens:
                    # Tokens are out: never switch targets mid-answer.
                    yield Error(
                        code=exc.kind,
                        message=str(exc),
                        retryable=exc.retryable,
                        partial=True,
                        road=target.road,
                        rule=rule_name,
                        target=target.endpoint,
                        kb=kb,
                        fell_back_from=tuple(passed),
                    )
                    return
                attempts.append(f"{target.endpoint}: {exc.kind}")
                passed.append(target.endpoint)
                last_error = exc
                if not exc.retryable:
                    break
            finally:
                replicas.ended(target.endpoint_id)
                if chat:
                    chat.end()
        if last_error is None and too_long is not None:
            too_long.kb = kb
            yield too_long
            return
        yield Error(
            code=last_error.kind if last_error else "unavailable",
            message="No target could answer: " + "; ".join(attempts),
            retryable=last_error.retryable if last_error else True,
            rule=rule_name,
            retry_after=await _soonest(skipped),
            kb=kb,
            fell_back_from=tuple(passed),
        )
    finally:
        meter.close()
        if reservation is not None:
            ledger.settle_soon(
                reservation,
                tokens=(meter.spent.prompt_tokens or 0) + (meter.spent.completion_tokens or 0),
                cost=meter.spent.cost or 0.0,
            )


class _Meter:
    """What the target answering is using, for the request log and the limits: the engine's
    usage when it reports it, else an estimate of what was produced (a stream cut short)."""

    def __init__(self, spent: Spent):
        self.spent = spent
        self.target: Target | None = None
        self.messages: list[dict] = []
        self.parts: list[str] = []
        self.since = 0.0

    def begin(self, target: Target, messages: list[dict], parts: list[str]) -> None:
        self.target, self.messages, self.parts = target, messages, parts
        self.since = time.monotonic()

    @property
    def prompt(self) -> int:
        """The prompt's tokens as estimated (counted only when the engine did not say)."""
        return sum(map(message_tokens, self.messages))

    def finish(self, finish: Finish) -> None:
        assert self.target is not None
        usage = finish.usage
        prompt = usage.prompt_tokens if usage else self.prompt
        completion = usage.completion_tokens if usage else approx_tokens("".join(self.parts))
        self.spent.prompt_tokens, self.spent.completion_tokens = prompt, completion
        self.spent.cost = self.target.price.cost(prompt, completion, finish.total)
        self.target = None

    def close(self) -> None:
        """The answer ended without a Finish: what the last target produced, if anything (a
        target that failed before its first token costs nothing)."""
        if self.target is None or not self.parts:
            return
        prompt, completion = self.prompt, approx_tokens("".join(self.parts))
        self.spent.prompt_tokens, self.spent.completion_tokens = prompt, completion
        self.spent.cost = self.target.price.cost(prompt, completion, time.monotonic() - self.since)
        self.target = None


def answer_budget(asked: int | None, rule: CompiledRule | None) -> int:
    """The max_tokens an engine is sent. The rule's value is the operator's ceiling on spend (and
    the length of an answer nobody asked a length for); under a rule without one, the gateway's
    ceiling caps and its default applies. A client may ask for less, never for more."""
    if rule is not None and rule.max_tokens:
        ceiling, default = rule.max_tokens, rule.max_tokens
    else:
        ceiling, default = settings.ROUTING_MAX_TOKENS_CEILING, settings.ROUTING_DEFAULT_MAX_TOKENS
    return min(asked, ceiling) if asked else min(default, ceiling)


async def _soonest(endpoints: list[str]) -> float | None:
    """When the first of the skipped endpoints takes requests again (its rest or cool-down over)."""
    waits = [
        state.retry_in
        for state in (await breaker.states(endpoints)).values()
        if state.retry_in is not None
    ]
    return round(min(waits), 1) if waits else None


def _record_miss(
    request: RouteRequest, question: str, answer_text: str, direct: DirectAnswer
) -> None:
    """Keep the question (and the generated answer) as a KB miss for curators, with the vector
    this request already computed: buffered in memory, written in batches, never awaited. A
    follow-up is no miss: it needs its conversation, no entry could answer it on its own. A turn
    that stores nothing keeps no copy of the question here either."""
    if direct.method == "follow_up" or not request.store:
        return
    miss_note(
        question=question,
        answer=answer_text,
        best_entry_id=direct.entry.pk if direct.entry else None,
        best_score=direct.score,
        model_id=direct.model.pk if direct.model else None,
        vector=direct.vector,
        reason=direct.reason,
        key=request.key,
    )


def _record_hit(request: RouteRequest, question: str, direct: DirectAnswer, entry_id: int) -> None:
    """Keep the direct answer for the review queue and calibration from traffic, with the vector
    this request computed (the exact and typo roads compute none): buffered, never awaited."""
    if request.key is None or not request.store:
        return
    lead = None
    if direct.score is not None:
        lead = direct.score - (direct.runner_up.score if direct.runner_up else 0.0)
    hit_note(
        key=request.key,
        question=question,
        entry_id=entry_id,
        method=direct.method,
        score=direct.score,
        lead=lead,
        model_id=direct.model.pk if direct.model else None,
        vector=direct.vector,
    )
