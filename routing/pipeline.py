"""The one answer pipeline. Every interface calls `answer()` and translates its events.

Events, in order: `route`, `token`…, then `done` or `error`. The KB road yields
the stored answer as one token. Generation streams from the first available
target of the matched rule's chain (a named model's endpoint first): a transient
failure before the first token is retried on the same target, a bounded number of
times with backoff, then the next target is tried (`retry_wait`; the policy is in
docs/architecture.md, "Retries and fallback"). A stream that breaks after its first
token is continued from where it was cut, its text sent as an assistant prefill to the
same target or the next that takes one (`_continue`); when none can, it ends with an
`error` event (partial=True) so the caller can keep the partial answer.

It runs as an async generator inside the ASGI process: no lock, no Celery hop.
Closing the generator (client gone, Stop) closes the upstream stream at once. The events
themselves are `routing.events`; a local engine that seems gone is reported by
`routing.engine_failures`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import re
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from core import tracing
from inference_ops import admission, engine_state, openai_fields
from inference_ops.client import Finish, stream_chat
from inference_ops.client import Token as EngineToken
from inference_ops.exceptions import EngineError
from knowledge.hits import hit_note
from knowledge.misses import miss_note
from knowledge.normalize import normalize
from knowledge.selectors import acontext_passages, adirect_answer
from knowledge.verdict import DirectAnswer
from routing import breaker, replicas
from routing.engine_failures import ENGINE_GONE, report_engine_failure
from routing.events import (
    PLAIN,
    Done,
    Error,
    Event,
    KbLookup,
    Passthrough,
    Route,
    RouteRequest,
    Spent,
    Token,
    route_event,
    usage_of,
)
from routing.prompt import (
    PROMPT_OVERHEAD,
    approx_tokens,
    build_messages,
    fields_tokens,
    message_tokens,
    passages_block,
    prompt_tokens,
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
from spend import engine_time, ledger
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
    snap = await asnapshot()
    if request.priority is None:  # none from its API key: its groups', if they have one
        request.priority = snap.priority_of(request.groups)

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
        assert rule is not None  # a target was found in its chain
        async for event in _generate(
            request,
            text,
            rule,
            named_chain(rule, target, rng),
            started,
            why=f"model {request.model} requested; {why}",
            rng=rng,
            specs=specs,
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


@dataclass
class _Plan:
    """What generating one answer needs, settled once before the first target is tried: the
    request, the rule and its chain, the prompt's parts, the token ceiling."""

    request: RouteRequest
    text: str
    rule: CompiledRule | None
    targets: list[Target]
    started: float
    why: str
    named: bool
    direct: DirectAnswer | None
    kb: KbLookup | None
    max_tokens: int
    temperature: float | None
    system: str  # the system message: the rule's prompt, the client's, the passages' instruction
    context: str  # this question's passages
    citations: list[dict]
    prompt_tokens: int  # the prompt's estimate with the whole history (spend, window checks)
    fixed_tokens: int  # what of it never trims: system, question, what follows it, tools

    @property
    def rule_name(self) -> str | None:
        return self.rule.name if self.rule else None

    @property
    def completion_tokens(self) -> int:
        """The answer's ceiling: max_tokens for each of the choices asked for."""
        return self.max_tokens * self.request.passthrough.choices


# How vLLM's and OpenAI's 400s name the window: "maximum context length is 4096 tokens",
# "maximum model length of 4096".
_ENGINE_LIMIT = re.compile(r"maximum (?:context|model) length (?:is|of) (\d+)")


@dataclass
class Attempts:
    """The chain tried so far: each target passed over and why, for the route's explanation, the
    request log and the last error (production-stack's router keeps the same in its RetryState).
    """

    notes: list[str] = dataclasses.field(default_factory=list)  # one line per target passed over
    passed: list[str] = dataclasses.field(default_factory=list)  # before the one that answers
    resting: list[str] = dataclasses.field(default_factory=list)  # kept closed by the breaker
    failure: EngineError | None = None  # the last engine failure
    refusal: Error | None = None  # the first target that cannot take the request as it is
    # Same-target retries before the first token: (endpoint, the failure's kind, seconds waited).
    retried: list[tuple[str, str, float]] = dataclasses.field(default_factory=list)
    # The largest context window an engine found the prompt too long for: smaller ones are
    # passed over.
    too_small: int | None = None

    def refused(self, target: Target, note: str, error: Error) -> None:
        """The request itself does not fit this target (too long, a field it does not take)."""
        self.notes.append(f"{target.endpoint}: {note}")
        self.refusal = self.refusal or error

    def skipped(self, target: Target, note: str) -> None:
        """The breaker keeps the target closed, or it asked to be left alone."""
        self.notes.append(f"{target.endpoint}: {note}")
        self.resting.append(target.endpoint)
        self.passed.append(target.endpoint)

    def retry(self, target: Target, exc: EngineError, wait: float) -> None:
        self.retried.append((target.endpoint, exc.kind, wait))

    def retry_notes(self) -> str:
        """The retries as the route's explanation says them."""
        return "; ".join(
            f"{endpoint}: {kind}, tried again after {wait:.2f}s"
            for endpoint, kind, wait in self.retried
        )

    def too_long(self, plan: _Plan, target: Target, exc: EngineError) -> None:
        """The engine found the prompt longer than its context window: a target with a larger
        window may take it; if none does, the client gets a 400 naming the limit."""
        # The engine's own limit when it says it (a row may claim more than its engine holds).
        said = _ENGINE_LIMIT.search(exc.detail)
        limit = int(said.group(1)) if said else target.context_window
        self.too_small = max(self.too_small or 0, min(limit, target.context_window))
        self.refused(
            target,
            "context_length",
            Error(
                code="too_long",
                message=f"The question does not fit the context window of {target.endpoint} "
                f"(set to {target.context_window} tokens, {plan.max_tokens} of them kept for "
                f"the answer); its engine said: {exc.detail}",
                rule=plan.rule_name,
                target=target.endpoint,
                road=target.road,
            ),
        )

    def failed(self, target: Target, exc: EngineError, tries: int = 1) -> None:
        self.notes.append(
            f"{target.endpoint}: {exc.kind}" + (f" ({tries} tries)" if tries > 1 else "")
        )
        self.passed.append(target.endpoint)
        if exc.retry_after is not None and exc.kind != "busy":
            self.resting.append(target.endpoint)
        self.failure = exc

    async def error(self, plan: _Plan) -> Error:
        """What the caller gets when no target answered."""
        if self.failure is None and self.refusal is not None:
            self.refusal.kb = plan.kb
            return self.refusal
        failure = self.failure
        if failure is not None and failure.refuses_request:
            return Error(
                code="request_refused",
                message=f"The model's server refused the request: {failure.detail}",
                rule=plan.rule_name,
                target=failure.endpoint or None,
                kb=plan.kb,
                fell_back_from=tuple(self.passed),
                retried=tuple(self.retried),
            )
        return Error(
            code=failure.kind if failure else "unavailable",
            message="No target could answer: " + "; ".join(self.notes),
            retryable=failure.retryable if failure else True,
            rule=plan.rule_name,
            retry_after=(
                failure.retry_after
                if failure is not None and failure.kind == "busy"
                else await _soonest(self.resting)
            ),
            kb=plan.kb,
            fell_back_from=tuple(self.passed),
            retried=tuple(self.retried),
        )


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
    plan: _Plan | None = None,
    attempt_of: Callable[..., _Attempt] | None = None,
) -> AsyncGenerator[Event, None]:
    """The chain tried in order, each target until one answers (see the module docstring).
    `plan` and `attempt_of`: another API's own (routing.raw_apis), instead of a chat answer's."""
    if plan is None:
        plan = await _plan(request, text, rule, targets, started, why=why, direct=direct)
    attempt_of = attempt_of or _Attempt
    reservation = None
    if specs:
        booked = await _reserve(plan, specs)
        if isinstance(booked, Error):
            yield booked
            return
        reservation = booked
    meter = _Meter(request.spent)
    attempts = Attempts()
    waiting = admission.Ticket(
        tenant=_tenant(request),
        priority=request.priority or ("api" if request.api_key_id else "interactive"),
        tokens=plan.prompt_tokens + plan.completion_tokens,
    )
    admission.ticket.set(waiting)
    request.spent.priority = waiting.priority  # the request log's class
    try:
        chain = replicas.expand(plan.targets, replicas.affinity_of(request.history, text))
        for at, target in enumerate(chain):
            if (refusal := _refusal(plan, target)) is not None:
                if plan.named and at == 0 and refusal[1].code != "too_long":
                    # The model named cannot take a field or API the client sent: the client's
                    # to change, not a failure another model should hide (a prompt too long for
                    # its window is what a larger one is for).
                    yield refusal[1]
                    return
                attempts.refused(target, *refusal)
                continue
            if attempts.too_small is not None and target.context_window <= attempts.too_small:
                attempts.notes.append(
                    f"{target.endpoint}: its {target.context_window}-token window is no larger"
                )
                continue
            # Counted before the checks below (which may wait on Redis), so the requests picking a
            # replica meanwhile see this one.
            replicas.started(target.endpoint_id)
            try:
                # An engine of ours that is starting (waited for when no target follows it) or kept
                # from its port by another process: never a connect error, never that process.
                if target.road == "local" and (
                    unserved := await engine_state.unserved(
                        target.endpoint_id,
                        wait=target.config.first_token_timeout if target is chain[-1] else 0.0,
                    )
                ):
                    attempts.refused(target, unserved.note, _unserved_error(plan, target, unserved))
                    continue
                if not await breaker.allow(target.endpoint):
                    attempts.skipped(target, "circuit open or resting after a Retry-After")
                    continue
                tries, first_try = 0, time.monotonic()
                while True:
                    produced, failure = False, None
                    attempt = attempt_of(
                        plan, target, attempts, meter, reservation.standing if reservation else None
                    )
                    try:
                        async with contextlib.aclosing(attempt.stream()) as stream:
                            async for event in stream:
                                if isinstance(event, Finish):
                                    request.spent.waited = waiting.waited
                                    for ending in await attempt.finished(event):
                                        yield ending
                                    return
                                if not produced:
                                    produced = True
                                    request.spent.waited = waiting.waited
                                    yield attempt.route(event.elapsed)
                                yield attempt.token(event)
                    except EngineError as exc:
                        attempt.failed(exc)
                        failure = exc
                    finally:
                        attempt.end()
                    assert failure is not None  # a stream ends with its Finish or an EngineError
                    tries += 1
                    if produced or failure.produced_tokens:
                        await _engine_failed(target, failure)
                        # Tokens are out: the answer goes on from where it was cut, or ends.
                        cut = Error(
                            code=failure.kind,
                            message=str(failure),
                            retryable=failure.retryable,
                            partial=True,
                            road=target.road,
                            rule=plan.rule_name,
                            target=target.endpoint,
                            kb=plan.kb,
                            fell_back_from=tuple(attempts.passed),
                            retried=tuple(attempts.retried),
                        )
                        if attempt_of is not _Attempt or not _continuable(plan, attempt, failure):
                            yield cut
                            return
                        rest = [t for t in chain[at + 1 :] if _refusal(plan, t) is None]
                        async for step in _continue(attempt, failure, rest, cut):
                            yield step
                        return
                    meter.failed(failure)
                    wait = retry_wait(target, failure, tries, first_try, rng)
                    if wait is None:
                        break
                    attempts.retry(target, failure, wait)
                    await asyncio.sleep(wait)
                # One vote per request for the breaker, however many tries it took.
                await _engine_failed(target, failure)
                if failure.kind == "content_filter":
                    # The same request meets the same policy anywhere: the provider's reason goes
                    # to the client as it is, no other target is asked.
                    yield Error(
                        code="content_filter",
                        message=failure.detail,
                        road=target.road,
                        rule=plan.rule_name,
                        target=target.endpoint,
                        kb=plan.kb,
                        fell_back_from=tuple(attempts.passed),
                        retried=tuple(attempts.retried),
                    )
                    return
                if failure.kind == "context_length":
                    attempts.too_long(plan, target, failure)
                    continue
                attempts.failed(target, failure, tries)
                if not failure.retryable:
                    break
            finally:
                replicas.ended(target.endpoint_id)
        request.spent.waited = waiting.waited
        yield await attempts.error(plan)
    finally:
        request.spent.waited = waiting.waited
        meter.close()
        if reservation is not None:
            ledger.settle_soon(
                reservation,
                tokens=(meter.spent.prompt_tokens or 0) + (meter.spent.completion_tokens or 0),
                cost=meter.spent.cost or 0.0,
            )


def _unserved_error(plan: _Plan, target: Target, unserved: engine_state.Unserved) -> Error:
    return Error(
        code=unserved.code,
        message=unserved.message,
        retryable=unserved.retryable,
        retry_after=unserved.retry_after,
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
    )


def _continuable(plan: _Plan, broken: _Attempt, failure: EngineError) -> bool:
    """Whether an answer cut after its first tokens may be continued elsewhere: plain text of one
    choice (a tool call's arguments or several choices cannot be resumed as a prefill), with
    nothing of the client's own after its question (its own prefill, tool results), and not cut
    by the request's own total time."""
    passthrough = plan.request.passthrough
    return (
        failure.kind != "timeout_total"
        and passthrough.choices == 1
        and not passthrough.after
        and not broken.meter.rich
        and bool(broken.text)
    )


@dataclass
class _Resumed:
    """What an answer continued after a cut carries from its attempts before: the text sent as the
    prefill, the first token's time, the usage (estimated for a stream cut before the engine said
    it), the endpoints that continued it."""

    text: list[str]
    ttft: float | None
    cut_at: str
    produced: int = 0  # the engines' chunks of the answer so far (about one token each)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    on: list[str] = dataclasses.field(default_factory=list)
    # The answer's chunks so far when each attempt that was cut began (0: the first).
    starts: list[int] = dataclasses.field(default_factory=lambda: [0])

    def usage(self, last: dict | None) -> dict | None:
        """The usage of every attempt: the last one's as its engine reported it, and the cut
        ones' derived from it. The last prompt is the first one with the answer so far appended
        (the prefill, as many tokens as the engines produced), so each cut attempt's prompt is
        the last one's less what was produced after that attempt began; the estimates only where
        that cannot hold."""
        if last is None:
            return None
        usage = dict(last)
        first = last["prompt_tokens"] - self.produced
        cut = sum(first + start for start in self.starts) if first > 0 else self.prompt_tokens
        usage["prompt_tokens"] = last["prompt_tokens"] + cut
        usage["completion_tokens"] = last["completion_tokens"] + self.completion_tokens
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage


async def _continue(
    broken: _Attempt, failure: EngineError, rest: list[Target], cut: Error
) -> AsyncGenerator[Event, None]:
    """Finish an answer whose stream broke after its first tokens: the text so far goes as an
    assistant prefill (`continue_final_message`) to the same target when it may be retried, then
    to the chain's next targets that accept one, and the new tokens follow the old in the same
    stream. When none can, `cut`: the original failure, never a prefill refusal in its place."""
    plan, attempts, meter = broken.plan, broken.attempts, broken.meter
    failed_at = timezone.now() if failure.kind in ENGINE_GONE else None
    resumed = _Resumed(
        text=list(broken.text),
        ttft=broken.ttft,
        cut_at=broken.target.endpoint,
        produced=failure.chunks,
    )
    resumed.prompt_tokens, resumed.completion_tokens = meter.carry(failure.chunks)
    attempts.notes.append(f"{broken.target.endpoint}: {failure.kind} after its first tokens")
    candidates = ([broken.target] if broken.target.config.retries else []) + rest
    for target in candidates:
        if not target.accepts_prefill:
            attempts.notes.append(f"{target.endpoint}: takes no prefill")
            continue
        replicas.started(target.endpoint_id)
        try:
            if target is not broken.target and not await breaker.allow(target.endpoint):
                attempts.notes.append(f"{target.endpoint}: circuit open or resting")
                continue
            # As before the first token: an engine of ours that is (re)starting is waited for
            # within its first-token budget when no target follows it; one kept from its port is
            # passed over. The engine that broke the stream may have died: its supervisor's check,
            # which the failure report asked for, is awaited before its port is tried again.
            if target.road == "local" and (
                unserved := await engine_state.unserved(
                    target.endpoint_id,
                    wait=target.config.first_token_timeout if target is candidates[-1] else 0.0,
                    failed_at=failed_at if target is broken.target else None,
                )
            ):
                attempts.notes.append(f"{target.endpoint}: {unserved.note}")
                continue
            attempt = _Attempt(plan, target, attempts, meter, broken.standing, resumed=resumed)
            new = False
            try:
                async with contextlib.aclosing(attempt.stream()) as stream:
                    async for event in stream:
                        if isinstance(event, Finish):
                            for ending in await attempt.finished(event):
                                yield ending
                            return
                        if not new:
                            new = True
                            yield attempt.route(event.elapsed)
                        yield attempt.token(event)
            except EngineError as exc:
                attempt.failed(exc)
                # A refused prefill (a 400) is no failure of the endpoint: not for the breaker.
                await _engine_failed(target, exc)
                attempts.notes.append(f"{target.endpoint}: {exc.kind} while continuing")
                if new or exc.produced_tokens:
                    # It added to the answer before it broke too: the next one goes on from there.
                    resumed.text.extend(attempt.text)
                    resumed.starts.append(resumed.produced)
                    resumed.produced += exc.chunks
                    prompt, completion = meter.carry(exc.chunks)
                    resumed.prompt_tokens += prompt
                    resumed.completion_tokens += completion
                else:
                    meter.failed(exc)
            finally:
                attempt.end()
        finally:
            replicas.ended(target.endpoint_id)
    yield cut


# Failures before the first token that another try of the same target may not meet: nothing
# reached the engine, it failed or was busy for a moment, it dropped the stream before a token.
_RETRIED = frozenset(
    {
        "connect",
        "timeout_connect",
        "timeout_first_token",
        "server_error",
        "rate_limited",
        "stream_error",
        "stream_truncated",
    }
)


def retry_wait(
    target: Target, exc: EngineError, tries: int, first_try: float, rng: random.Random
) -> float | None:
    """How long to wait before trying `target` again after its `tries`-th failure, or None to
    go on to the next target. The endpoint's retries are bounded (`retries`); the wait is its
    Retry-After when it sent one, else an exponential backoff with full jitter (a random time up
    to base × 2^(tries-1), capped), so that many gateways retrying together spread out. A retry
    must fit in the endpoint's first-token timeout counted from its first try: a 429 asking for
    longer, or an endpoint that hung, sends the request on to the next target instead."""
    config = target.config
    if tries > config.retries or exc.kind not in _RETRIED:
        return None
    if exc.retry_after is not None:
        wait = exc.retry_after
    else:
        wait = rng.uniform(0.0, min(config.retry_cap, config.retry_base * 2 ** (tries - 1)))
    if time.monotonic() + wait >= first_try + config.first_token_timeout:
        return None
    return wait


async def _plan(
    request: RouteRequest,
    text: str,
    rule: CompiledRule | None,
    targets: list[Target],
    started: float,
    *,
    why: str,
    direct: DirectAnswer | None,
) -> _Plan:
    """The answer's prompt parts and ceilings: the rule's prompt and the client's, this question's
    KB passages, the token ceiling, the prompt's size."""
    passthrough = request.passthrough
    passages = []
    if rule is not None and rule.use_kb_context and text.strip():
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
    fixed = (
        PROMPT_OVERHEAD
        + message_tokens({"content": system})
        + approx_tokens(context)
        + message_tokens(_question(request) or {})
        + sum(map(message_tokens, passthrough.after))
        + fields_tokens(passthrough.fields)
    )
    if passthrough.not_plain is not None and passthrough is not PLAIN:
        why = f"{why}; the knowledge base was not asked: {passthrough.not_plain}"
    return _Plan(
        request=request,
        text=text,
        rule=rule,
        targets=targets,
        started=started,
        why=why,
        named=bool(request.model) and request.model != "auto",
        direct=direct,
        kb=KbLookup.of(direct) if direct is not None else None,
        max_tokens=answer_budget(request.max_tokens, rule),
        temperature=(
            request.temperature
            if request.temperature is not None
            else (rule.temperature if rule else None)
        ),
        system=system,
        context=context,
        citations=[{"entry_id": p.entry_id, "label": p.label} for p in passages],
        prompt_tokens=fixed + sum(map(message_tokens, request.history)),
        fixed_tokens=fixed,
    )


def _question(request: RouteRequest) -> dict | None:
    """The question message as the client sent it (its parts), or as its text."""
    if request.passthrough is PLAIN:
        return {"role": "user", "content": request.text}
    return request.passthrough.question


async def _reserve(plan: _Plan, specs: tuple[Spec, ...]) -> ledger.Reservation | Error:
    """The request's share of its limits, or the refusal: the prompt as if no history were left
    out (so never under the real one) and the answer's ceiling for every choice, priced at the
    dearest target that may answer."""
    prompt, completion = plan.prompt_tokens, plan.completion_tokens
    booked = await ledger.areserve(
        specs, tokens=prompt + completion, cost=_dearest(plan.targets, prompt, completion)
    )
    if isinstance(booked, ledger.Refusal):
        return Error(
            code=booked.code,
            message=booked.message,
            retryable=booked.retry_after is not None,
            retry_after=booked.retry_after,
            rule=plan.rule_name,
            kb=plan.kb,
            standing=booked.standing,
        )
    return booked


def _dearest(targets: list[Target], prompt: int, completion: int) -> float:
    """The most the answer may cost at any endpoint that may take it, a replica group's members
    included: its tokens at the endpoint's prices and, for one priced by its time, the engine
    seconds the answer may hold it (spend.engine_time)."""
    most = 0.0
    for target in targets:
        for one in target.replicas or (target,):
            price = one.price
            seconds = 0.0
            if price.per_engine_second:
                seconds = engine_time.estimate(
                    one.endpoint_id,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    ceiling=one.config.total_timeout,
                )
            most = max(most, price.cost(prompt, completion, seconds))
    return most


def _refusal(plan: _Plan, target: Target) -> tuple[str, Error] | None:
    """Why the request as it is cannot go to this target (a note for the route's explanation,
    and the error if no target can take it), or None."""
    if (api := plan.request.api) not in target.apis:
        return f"serves no {api}", Error(
            code="unsupported_api",
            message=f"{target.endpoint} serves {', '.join(sorted(target.apis))}, not {api}.",
            param="model",
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
        )
    limited = plan.request.passthrough.limited
    if limited and (name := openai_fields.field_refused(limited, target.kind)) is not None:
        return f"takes no {name}", Error(
            code="unsupported_parameter",
            message=openai_fields.refusal_for(name, limited[name], target.kind, target.endpoint),
            param=name.split(" ")[0],
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
        )
    if plan.fixed_tokens + 8 > target.context_window - plan.max_tokens:
        return f"the question does not fit its {target.context_window}-token window", Error(
            code="too_long",
            rule=plan.rule_name,
            target=target.endpoint,
            road=target.road,
            message=(
                f"The question is about {plan.fixed_tokens} tokens; {target.endpoint} accepts "
                f"at most {target.context_window} tokens, {plan.max_tokens} of them kept for the "
                "answer."
            ),
        )
    return None


def done_event(
    plan: _Plan, target: Target, finish: Finish, attempts: Attempts, ttft: float | None
) -> Done:
    """The end of an answer `target` finished."""
    return Done(
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
        ttft_ms=ttft,
        latency_ms=_ms(time.monotonic() - plan.started),
        usage=usage_of(finish),
        finish_reason=finish.finish_reason,
        citations=plan.citations,
        engine_ms=_ms(finish.total),
        kb=plan.kb,
        fell_back_from=tuple(attempts.passed),
        finish_reasons=finish.finish_reasons if len(finish.finish_reasons) > 1 else None,
        system_fingerprint=finish.system_fingerprint,
        retried=tuple(attempts.retried),
        skipped_chunks=finish.skipped_chunks,
    )


async def _engine_failed(target: Target, exc: EngineError) -> None:
    """What a failure tells the breaker and the engine's supervisor (nothing when the endpoint
    had no room: that queue is the gateway's own, inference_ops.admission)."""
    if exc.kind == "busy":
        return
    if exc.retry_after is not None:
        await breaker.rest(target.endpoint, exc.retry_after)
    elif exc.retryable:
        await breaker.failure(target.endpoint)
    if exc.kind in ENGINE_GONE and target.road == "local":
        report_engine_failure(target.endpoint_id)


class _Attempt:
    """One target's try at the answer: the prompt it is sent, the engine's stream, and what that
    stream's events become (the route at the first token, or at the end of an empty answer, the
    tokens, the done event). `_generate` drives it: no generator layer of its own between the
    engine's stream and the caller, since every token passes through here."""

    def __init__(
        self,
        plan: _Plan,
        target: Target,
        attempts: Attempts,
        meter: _Meter,
        standing: ledger.Standing | None,
        *,
        resumed: _Resumed | None = None,
    ):
        self.plan, self.target, self.attempts = plan, target, attempts
        self.meter, self.standing = meter, standing
        self.resumed = resumed  # continuing an answer cut elsewhere
        self.ttft: float | None = None
        self.dropped = 0  # history messages left out to fit the window
        self.text: list[str] = []
        self.chat = (
            tracing.Chat(
                model=target.config.model,
                base_url=target.config.base_url,
                max_tokens=plan.max_tokens,
                temperature=plan.temperature,
            )
            if tracing.ENABLED
            else None
        )

    def stream(self) -> AsyncGenerator[EngineToken | Finish, None]:
        """The engine's stream for this target: the chat prompt, laid out for its window."""
        request, plan = self.plan.request, self.plan
        passthrough = request.passthrough
        messages, self.dropped = build_messages(
            system=plan.system,
            history=request.history,
            replay=plan.rule is None or plan.rule.replay_passages,
            question=_question(request),
            budget=self.target.context_window - plan.max_tokens,
            passages=plan.context,
            after=passthrough.after,
        )
        max_tokens, extra_body = plan.max_tokens, None
        if self.resumed is not None:
            # The answer so far as the assistant's message, which the engine continues (vLLM's
            # fields; the template then leaves the turn open); the ceiling is what is left of it.
            so_far = "".join(self.resumed.text)
            messages.append({"role": "assistant", "content": so_far})
            extra_body = {"continue_final_message": True, "add_generation_prompt": False}
            max_tokens = max(1, plan.max_tokens - (self.resumed.produced or approx_tokens(so_far)))
        self.meter.begin(self.target, messages, self.text)
        return stream_chat(
            self.target.config,
            messages,
            max_tokens=max_tokens,
            max_tokens_field=passthrough.max_tokens_field,
            temperature=plan.temperature,
            fields=passthrough.fields,
            extra_body=extra_body,
        )

    def route(self, engine_seconds: float, *, first_token: bool = True) -> Route:
        self.ttft = _ms(time.monotonic() - self.plan.started)
        if self.chat and first_token:
            self.chat.first_chunk(engine_seconds)
        if self.resumed is not None:
            return self._continued_route(engine_seconds)
        return route_event(
            self.target,
            self.plan.rule_name,
            self.plan.why,
            self.attempts.notes,
            self.dropped,
            retries=self.attempts.retry_notes() if self.attempts.retried else "",
            # A named request answered by a fallback was not answered by the model named.
            named=self.plan.named and self.target.endpoint == self.plan.request.model,
            engine_ms=_ms(engine_seconds),
            standing=self.standing,
            context=self.plan.context,
        )

    def _continued_route(self, engine_seconds: float) -> Route:
        """The route of the answer's continuation: where it goes on, and where it was cut."""
        resumed, target = self.resumed, self.target
        assert resumed is not None
        same = target.endpoint == resumed.cut_at
        return Route(
            road=target.road,
            rule=self.plan.rule_name,
            target=target.endpoint,
            why=f"{self.plan.why}. Continued on {target.endpoint} from where the stream was cut, "
            f"the partial answer sent as a prefill, after " + "; ".join(self.attempts.notes),
            reason="the answer was cut short and is continued by the "
            + ("same model" if same else f"{target.road} model"),
            engine_ms=_ms(engine_seconds),
            standing=self.standing,
            continued_from=resumed.cut_at,
            context=self.plan.context,
        )

    def token(self, event: EngineToken) -> Token:
        self.text.append(event.text)
        if event.choices is not None:
            self.meter.extra(event.choices)
        return Token(text=event.text, choices=event.choices)

    async def finished(self, event: Finish) -> list[Event]:
        """The events that end the answer: the route, for an answer without a token, and done."""
        if self.chat:
            self.chat.finished(event.finish_reason, event.usage)
        await breaker.success(self.target.endpoint)
        self.meter.finish(event)
        ending: list[Event] = []
        if self.ttft is None:  # an answer without a token
            ending.append(self.route(event.total, first_token=False))
        plan, resumed = self.plan, self.resumed
        text = "".join(self.text) if resumed is None else "".join(resumed.text + self.text)
        if plan.direct is not None:
            _record_miss(plan.request, plan.text, text, plan.direct)
        done = done_event(plan, self.target, event, self.attempts, self.ttft)
        if resumed is not None:
            resumed.on.append(self.target.endpoint)
            done.ttft_ms = resumed.ttft
            done.usage = resumed.usage(done.usage)
            done.continued = tuple(resumed.on)
        ending.append(done)
        return ending

    def failed(self, exc: EngineError) -> None:
        if self.chat:
            self.chat.failed(exc.kind)

    def end(self) -> None:
        if self.chat:
            self.chat.end()


class _Meter:
    """What the answer is using, for the request log and the limits: the engine's usage when it
    reports it, else an estimate of what the engine took, its prompt and what it produced (a
    stream cut short, stopped, failed). A request sent to an engine costs at least its prompt:
    the engine read it (its prefix cache moved), and an external API bills it."""

    def __init__(self, spent: Spent):
        self.spent = spent
        self.target: Target | None = None  # the target the request went to, until it is counted
        self.messages: list[dict] = []
        self.parts: list[str] = []
        self.rich: list[list[dict]] = []  # the choices of chunks that held more than text
        self.since = 0.0
        # What targets that failed before their first token took: their prompts and the cost.
        self.taken_tokens = 0
        self.taken_cost = 0.0
        self.taken_completion = 0  # what streams cut mid-answer produced, before a continuation

    def begin(self, target: Target, messages: list[dict], parts: list[str]) -> None:
        self.target, self.messages, self.parts, self.rich = target, messages, parts, []
        self.since = time.monotonic()

    def extra(self, choices: list[dict]) -> None:
        """Keep a chunk's choices beyond the first choice's text, read when the answer ends (not
        per chunk): what they produced, when the engine does not say, and the tool calls."""
        self.rich.append(choices)

    def _read_rich(self) -> str:
        """What the kept choices produced (tool calls' arguments, other choices' text); counts the
        tool calls."""
        produced = []
        for choices in self.rich:
            for choice in choices:
                delta = choice.get("delta") or {}
                if choice.get("index"):  # another choice's text (a completion's: `text`)
                    produced.append(choice.get("text") or delta.get("content") or "")
                for call in delta.get("tool_calls") or ():
                    produced.append((call.get("function") or {}).get("arguments") or "")
                    if call.get("id"):
                        self.spent.tool_calls += 1
        self.rich = []
        return "".join(produced)

    @property
    def prompt(self) -> int:
        """The prompt's tokens as estimated (counted only when the engine did not say)."""
        return prompt_tokens(self.messages)

    def _produced(self) -> int:
        return approx_tokens("".join(self.parts) + self._read_rich())

    def finish(self, finish: Finish) -> None:
        target = self.target
        assert target is not None
        usage = finish.usage
        if usage:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
            if self.rich:
                self._read_rich()  # the tool calls
        else:
            prompt, completion = self.prompt, self._produced()
        if target.price.per_engine_second:  # what the next reservations' engine time is told
            engine_time.observe(
                target.endpoint_id,
                prompt_tokens=prompt,
                completion_tokens=completion,
                seconds=finish.total,
            )
        self._count(prompt, completion, target.price.cost(prompt, completion, finish.total))

    def failed(self, exc: EngineError) -> None:
        """The target failed before its first token; the next one (if any) starts afresh. It took
        the prompt unless nothing reached it or it refused the request with an HTTP error."""
        target = self.target
        if target is None:
            return
        self.target = None
        if exc.kind in ("connect", "timeout_connect", "busy") or exc.status_code is not None:
            return  # nothing reached the engine (busy: no room, it waited in the gateway)
        prompt = self.prompt
        self.taken_tokens += prompt
        self.taken_cost += target.price.cost(prompt, 0, time.monotonic() - self.since)

    def carry(self, chunks: int) -> tuple[int, int]:
        """The target's stream broke after its first tokens and the answer goes on elsewhere: what
        it took and produced is counted with the rest (a cut stream says no usage: its prompt
        estimated, its completion the chunks it sent, about a token each, else estimated).
        Returns its prompt and completion tokens."""
        target = self.target
        if target is None:
            return 0, 0
        self.target = None
        prompt, completion = self.prompt, chunks or self._produced()
        self.taken_tokens += prompt
        self.taken_completion += completion
        self.taken_cost += target.price.cost(prompt, completion, time.monotonic() - self.since)
        return prompt, completion

    def close(self) -> None:
        """The answer ended without a Finish (stopped, cut short, no target left): the last
        target's prompt and what it produced, if it was sent one, and what failed targets took.
        A stop while the gateway still waited for one of the endpoint's own slots counts as sent:
        from here the two cannot be told apart, and the count errs on the side of the limit."""
        target = self.target
        if target is not None:
            prompt = self.prompt
            completion = self._produced() if self.parts or self.rich else 0
            elapsed = time.monotonic() - self.since
            self._count(prompt, completion, target.price.cost(prompt, completion, elapsed))
        elif self.taken_tokens and self.spent.prompt_tokens is None:
            self._count(0, 0, 0.0)

    def _count(self, prompt: int, completion: int, cost: float) -> None:
        self.spent.prompt_tokens = prompt + self.taken_tokens
        self.spent.completion_tokens = completion + self.taken_completion
        self.spent.cost = cost + self.taken_cost
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


def _tenant(request: RouteRequest) -> str:
    """Whose fair share a request counts in: its user (an API key's requests are its owner's)."""
    return f"u{request.user_id}" if request.user_id is not None else "anonymous"


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
