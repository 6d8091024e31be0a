"""An answer whose stream broke after its first tokens, continued from where it was cut
(`continue_answer`): its text so far sent as an assistant prefill to the same target or the
next that takes one, the new tokens following the old in the same stream; when none can, the
cut's error (partial), so the caller keeps the partial answer. Whether an answer may be
continued at all: `continuable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from django.utils import timezone

from inference_ops import engine_state
from inference_ops.client import Finish
from inference_ops.exceptions import EngineError
from routing import breaker, replicas
from routing.attempt import Attempt, Resumed
from routing.compiled import Target
from routing.engine_failures import ENGINE_GONE
from routing.events import Error, Event
from routing.failures import engine_failed
from routing.plan import Plan


def continuable(plan: Plan, broken: Attempt, failure: EngineError) -> bool:
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


async def continue_answer(
    broken: Attempt, failure: EngineError, rest: list[Target], cut: Error
) -> AsyncGenerator[Event, None]:
    """Finish an answer whose stream broke after its first tokens: the text so far goes as an
    assistant prefill (`continue_final_message`) to the same target when it may be retried, then
    to the chain's next targets that accept one, and the new tokens follow the old in the same
    stream. When none can, `cut`: the original failure, never a prefill refusal in its place."""
    plan, attempts, meter = broken.plan, broken.attempts, broken.meter
    failed_at = timezone.now() if failure.kind in ENGINE_GONE else None
    resumed = Resumed(
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
            attempt = Attempt(plan, target, attempts, meter, broken.standing, resumed=resumed)
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
                        if (token := attempt.token(event)).says_something:
                            yield token
            except EngineError as exc:
                attempt.failed(exc)
                # A refused prefill (a 400) is no failure of the endpoint: not for the breaker.
                await engine_failed(target, exc)
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
