"""The chain tried in order (`generate`): each target until one answers. A transient failure
before the first token is tried again on the same target (`failures.retry_wait`), then the next
target is asked; a stream cut after its first tokens is continued elsewhere
(`routing.continuation`). Around the walk: the answer's place in the endpoints' admission queue
(inference_ops.admission), its reservation against the caller's limits and their settlement
(`routing.spending`). A chat answer and a raw completion (routing.completions) both go through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable

from inference_ops import admission, engine_state
from inference_ops.client import Finish
from inference_ops.exceptions import EngineError
from knowledge.verdict import DirectAnswer
from routing import breaker, replicas
from routing.attempt import Attempt
from routing.compiled import CompiledRule, Target
from routing.continuation import continuable, continue_answer
from routing.events import Error, Event, RouteRequest
from routing.failures import (
    Attempts,
    content_filtered,
    cut_error,
    engine_failed,
    retry_wait,
    unserved_error,
)
from routing.plan import Plan, build_plan, target_refusal
from routing.spending import Meter, reserve
from spend import ledger
from spend.policy import Spec


async def generate(
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
    plan: Plan | None = None,
    attempt_of: Callable[..., Attempt] | None = None,
) -> AsyncGenerator[Event, None]:
    """The chain tried in order, each target until one answers (see the module docstring).
    `plan` and `attempt_of`: another API's own (routing.completions), instead of a chat answer's."""
    if plan is None:
        plan = await build_plan(request, text, rule, targets, started, why=why, direct=direct)
    attempt_of = attempt_of or Attempt
    reservation = None
    if specs:
        booked = await reserve(plan, specs)
        if isinstance(booked, Error):
            yield booked
            return
        reservation = booked
    meter = Meter(request.spent)
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
            if (refusal := target_refusal(plan, target)) is not None:
                if plan.named and at == 0 and refusal[1].code not in ("too_long", "personal_data"):
                    # The model named cannot take a field or API the client sent: the client's
                    # to change, not a failure another model should hide (a prompt too long for
                    # its window is what a larger one is for, personal data what the local road
                    # is for).
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
                    attempts.refused(target, unserved.note, unserved_error(plan, target, unserved))
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
                                if (token := attempt.token(event)).says_something:
                                    yield token
                    except EngineError as exc:
                        attempt.failed(exc)
                        failure = exc
                    finally:
                        attempt.end()
                    assert failure is not None  # a stream ends with its Finish or an EngineError
                    tries += 1
                    if produced or failure.produced_tokens:
                        await engine_failed(target, failure)
                        # Tokens are out: the answer goes on from where it was cut, or ends.
                        cut = cut_error(plan, target, attempts, failure)
                        if attempt_of is not Attempt or not continuable(plan, attempt, failure):
                            yield cut
                            return
                        rest = [t for t in chain[at + 1 :] if target_refusal(plan, t) is None]
                        async for step in continue_answer(attempt, failure, rest, cut):
                            yield step
                        return
                    meter.failed(failure)
                    wait = retry_wait(target, failure, tries, first_try, rng)
                    if wait is None:
                        break
                    attempts.retry(target, failure, wait)
                    await asyncio.sleep(wait)
                # One vote per request for the breaker, however many tries it took.
                await engine_failed(target, failure)
                if failure.kind == "content_filter":
                    # The same request meets the same policy anywhere: the provider's reason goes
                    # to the client as it is, no other target is asked.
                    yield content_filtered(plan, target, attempts, failure)
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


def _tenant(request: RouteRequest) -> str:
    """Whose fair share a request counts in: its user (an API key's requests are its owner's)."""
    return f"u{request.user_id}" if request.user_id is not None else "anonymous"
