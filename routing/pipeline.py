"""The one answer pipeline. Every interface calls `answer()` and translates its events.

Events, in order: `route`, `token`…, then `done` or `error`. The KB road yields
the stored answer as one token. Generation streams from the first available
target of the matched rule's chain: a failure before the first token moves on to
the next target; after the first token the pipeline never switches and ends with
an `error` event (partial=True) so the caller can keep the partial answer.

It runs as an async generator inside the ASGI process: no lock, no Celery hop.
Closing the generator (client gone, Stop) closes the upstream stream at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connections

from core import tracing
from inference_ops.client import Finish, stream_chat
from inference_ops.exceptions import EngineError
from inference_ops.tasks import engines_check_after_failure
from knowledge.misses import miss_note
from knowledge.normalize import normalize
from knowledge.selectors import acontext_passages, adirect_answer
from knowledge.verdict import DirectAnswer
from routing import breaker, replicas
from routing.prompt import approx_tokens, build_messages, message_tokens, system_message
from routing.rules import (
    CompiledRule,
    Context,
    Snapshot,
    Target,
    asnapshot,
    named_target,
    query_vector,
)

logger = logging.getLogger(__name__)


@dataclass
class RouteRequest:
    text: str
    history: list[dict] = field(default_factory=list)
    user_id: int | None = None
    groups: frozenset[str] = frozenset()
    client: str = "web"
    # a model name from /v1/models forces that target; None or "auto" routes
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    # vLLM's extension, for local engines only (an external API may refuse it)
    ignore_eos: bool = False
    # The client's own instructions (e.g. a system message sent to /v1), added to the rule's.
    system: str = ""
    # False for a turn that stores nothing (a /v1 call naming no session): it leaves no KB miss.
    store: bool = True


@dataclass(frozen=True, slots=True)
class KbLookup:
    """The KB check's verdict in a few numbers, for the request log and the metrics."""

    method: str  # exact | vector | none | follow_up
    hit: bool
    entry_id: int | None  # the entry that answered, or the best candidate that did not
    score: float | None

    @classmethod
    def of(cls, direct: DirectAnswer) -> KbLookup:
        return cls(
            method=direct.method,
            hit=direct.hit,
            entry_id=direct.entry.pk if direct.entry else None,
            score=None if direct.score is None else round(direct.score, 4),
        )


# What the request log and the metrics read of an event, but the client's frame leaves out: the
# KB's scores and the endpoints that failed are the operators' business.
_NOT_FOR_CLIENTS = ("kb", "fell_back_from")


@dataclass(kw_only=True)
class Event:
    type: str

    def as_dict(self, *, details: bool = False) -> dict:
        """The event as a client's frame. `details`: for the staff who may read the routing rules;
        everyone else reads a route's plain reason and an engine failure's plain message."""
        # The fields as they are (no deep copy like dataclasses.asdict): one per token frame.
        fields = dict(self.__dict__)
        for name in _NOT_FOR_CLIENTS:
            fields.pop(name, None)
        return fields


@dataclass(kw_only=True)
class Route(Event):
    road: str  # kb | local | external
    rule: str | None
    target: str | None
    # The details: KB scores and thresholds, the rule's conditions, the endpoints passed over and
    # why.
    why: str
    reason: str  # what a user reads instead: the road and a plain reason
    # the engine's time up to its first token, as this gateway saw it
    engine_ms: float | None = None
    type: str = "route"

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        reason = fields.pop("reason")
        if not details:
            fields["why"] = reason
        return fields


@dataclass(kw_only=True)
class Token(Event):
    text: str
    type: str = "token"


@dataclass(kw_only=True)
class Done(Event):
    road: str
    rule: str | None
    target: str | None
    ttft_ms: float | None
    latency_ms: float
    usage: dict | None
    finish_reason: str
    citations: list[dict]
    kb_entry_id: int | None = None  # the entry that answered (the KB road)
    # the engine's time, request to last byte; None when no engine ran
    engine_ms: float | None = None
    kb: KbLookup | None = None  # what the KB check found, also when it did not answer
    fell_back_from: tuple[
        str, ...
    ] = ()  # endpoints passed over (failed or resting) before the answer
    # the gateway's own time, set by the interface that times the request
    overhead_ms: float | None = None
    type: str = "done"


@dataclass(kw_only=True)
class Error(Event):
    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None  # seconds until a target may answer again, when one said so
    partial: bool = False  # tokens were already sent
    road: str | None = None
    rule: str | None = None
    target: str | None = None
    kb: KbLookup | None = None
    fell_back_from: tuple[str, ...] = ()
    type: str = "error"

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        if not details:
            fields["message"] = message_for_users(self.code, self.message, partial=self.partial)
        return fields


# Errors whose message names endpoints, hosts, status lines or the attempts before: an engine's
# failure (EngineError.kind), or no target left to try.
_OPERATORS_FAILURES = frozenset(EngineError.KINDS) | {"unavailable", "no_target"}


def message_for_users(code: str, message: str, *, partial: bool) -> str:
    """An error's message as a user reads it: the message itself when it is about the request (too
    long, an unknown model, …), a plain one when it is about the operator's engines."""
    if code not in _OPERATORS_FAILURES:
        return message
    return (
        "The model failed while answering."
        if partial
        else "No model could answer this question right now."
    )


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
        rule, why = await _match(snap, request, text, None)
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

    rule, why = await _match(snap, request, text, direct)
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
        request, text, rule, targets, started, why=why, rng=rng, direct=direct
    ):
        yield event


async def _match(
    snap: Snapshot, request: RouteRequest, text: str, direct: DirectAnswer | None
) -> tuple[CompiledRule | None, str]:
    ctx = Context(
        text=text,
        groups=request.groups,
        client=request.client,
        model=request.model,
        vector=direct.vector if direct is not None else None,
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
    system = system_message(prompt, passages)
    citations = [{"entry_id": p.entry_id, "label": p.label} for p in passages]

    kb = KbLookup.of(direct) if direct is not None else None
    attempts: list[str] = []
    passed: list[str] = []  # endpoints passed over before the one that answers
    skipped: list[str] = []  # endpoints the breaker kept closed to this request
    last_error: EngineError | None = None
    too_long: Error | None = None
    system_cost = message_tokens({"content": system})
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
            system=system, history=request.history, question=text, budget=budget
        )
        produced = False
        ttft: float | None = None
        answer_text: list[str] = []
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
                        if not produced:
                            ttft = _ms(time.monotonic() - started)
                            yield _route(
                                target,
                                rule_name,
                                why,
                                attempts,
                                dropped,
                                named=named,
                                engine_ms=_ms(event.total),
                            )
                        if direct is not None:
                            _record_miss(request, text, "".join(answer_text), direct)
                        yield Done(
                            road=target.road,
                            rule=rule_name,
                            target=target.endpoint,
                            ttft_ms=ttft,
                            latency_ms=_ms(time.monotonic() - started),
                            usage=_usage(event),
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
                        yield _route(
                            target,
                            rule_name,
                            why,
                            attempts,
                            dropped,
                            named=named,
                            engine_ms=_ms(event.elapsed),
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
            if exc.kind in _ENGINE_GONE and target.road == "local":
                _report_engine_failure(target.endpoint_id)
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


# Failures that say the engine process itself may be gone (not busy): its supervisor should look
# now.
_ENGINE_GONE = frozenset({"connect", "timeout_connect", "stream_truncated"})
_failure_reported_at: dict[int, float] = {}
_check_requests = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-check")


def _report_engine_failure(endpoint_id: int) -> None:
    """Ask the supervisor to check this endpoint's engines now, without waiting for it: a crashed
    engine is restarted seconds sooner than the next beat tick would notice. At most once per
    ENGINE_SUSPECT_SECONDS per endpoint and process (and across processes, by a Redis key)."""
    now = time.monotonic()
    if now - _failure_reported_at.get(endpoint_id, -1e9) < settings.ENGINE_SUSPECT_SECONDS:
        return
    _failure_reported_at[endpoint_id] = now
    _check_requests.submit(_enqueue_engine_checks, endpoint_id)


def _enqueue_engine_checks(endpoint_id: int) -> None:
    try:
        engines_check_after_failure(endpoint_id)
    except Exception:  # noqa: BLE001 - the beat's checks still come
        logger.warning(
            "cannot ask for a check of endpoint %s's engines", endpoint_id, exc_info=True
        )
    finally:
        connections.close_all()


def _usage(finish: Finish) -> dict | None:
    if finish.usage is None:
        return None
    prompt, completion = finish.usage.prompt_tokens, finish.usage.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _route(
    target: Target,
    rule: str | None,
    why: str,
    attempts: list[str],
    dropped: int,
    *,
    named: bool,
    engine_ms: float,
) -> Route:
    notes = [why]
    reason = f"answered by the {target.road} model" + (" you named" if named else "")
    if attempts:
        notes.append("fell back after " + "; ".join(attempts))
        reason += ", as a fallback: the first choice could not answer"
    if dropped:
        notes.append(f"{dropped} oldest history message(s) left out to fit the context window")
        reason += (
            "; the oldest messages of the conversation were left out to fit the model's "
            "context window"
        )
    return Route(
        road=target.road,
        rule=rule,
        target=target.endpoint,
        why=". ".join(notes),
        reason=reason,
        engine_ms=engine_ms,
    )


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
    )
