"""What a target's failure leads to: another try of the same target (`retry_wait`), its vote with
the breaker and the engine's supervisor (`engine_failed`), the record of the targets passed over
(`Attempts`), and the error the caller gets, built here for every road that asks a model: a chat
answer, a completion, embeddings.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from dataclasses import dataclass

from inference_ops import engine_state
from inference_ops.exceptions import EngineError
from routing import breaker
from routing.compiled import Target
from routing.engine_failures import ENGINE_GONE, report_engine_failure
from routing.events import Error
from routing.plan import Plan

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

    def too_long(self, plan: Plan, target: Target, exc: EngineError) -> None:
        """The engine found the prompt longer than its context window: a target with a larger
        window may take it; if none does, the client gets a 400 naming the limit."""
        # The engine's own limit when it says it (a row may claim more than its engine holds).
        said = _ENGINE_LIMIT.search(exc.detail)
        limit = int(said.group(1)) if said else target.context_window
        self.too_small = max(self.too_small or 0, min(limit, target.context_window))
        self.refused(target, "context_length", engine_too_long(plan, target, exc))

    def failed(self, target: Target, exc: EngineError, tries: int = 1) -> None:
        self.notes.append(
            f"{target.endpoint}: {exc.kind}" + (f" ({tries} tries)" if tries > 1 else "")
        )
        self.passed.append(target.endpoint)
        if exc.retry_after is not None and exc.kind != "busy":
            self.resting.append(target.endpoint)
        self.failure = exc

    async def error(self, plan: Plan) -> Error:
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


async def _soonest(endpoints: list[str]) -> float | None:
    """When the first of the skipped endpoints takes requests again (its rest or cool-down over)."""
    waits = [
        state.retry_in
        for state in (await breaker.states(endpoints)).values()
        if state.retry_in is not None
    ]
    return round(min(waits), 1) if waits else None


def unserved_error(plan: Plan, target: Target, unserved: engine_state.Unserved) -> Error:
    return Error(
        code=unserved.code,
        message=unserved.message,
        retryable=unserved.retryable,
        retry_after=unserved.retry_after,
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
    )


def engine_too_long(plan: Plan, target: Target, exc: EngineError) -> Error:
    """The engine found the request longer than its context window: the request's own fault, a
    400 naming the limit. A question's window keeps room for the answer; an embeddings request has
    no answer (its max_tokens is 0) and the field at fault is its `input`."""
    question = plan.max_tokens > 0
    kept = (
        f" (set to {target.context_window} tokens, {plan.max_tokens} of them kept for the answer)"
        if question
        else ""
    )
    return Error(
        code="too_long",
        message=f"The {'question' if question else 'input'} does not fit the context window of "
        f"{target.endpoint}{kept}; its engine said: {exc.detail}",
        param=None if question else "input",
        rule=plan.rule_name,
        target=target.endpoint,
        road=target.road,
    )


def content_filtered(plan: Plan, target: Target, attempts: Attempts, exc: EngineError) -> Error:
    """A content-policy refusal: the same request meets the same policy anywhere, so the
    provider's reason goes to the client as it is and no other target is asked."""
    return Error(
        code="content_filter",
        message=exc.detail,
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
        kb=plan.kb,
        fell_back_from=tuple(attempts.passed),
        retried=tuple(attempts.retried),
    )


def cut_error(plan: Plan, target: Target, attempts: Attempts, exc: EngineError) -> Error:
    """A stream that broke after its first tokens, when its answer is not continued: partial, so
    the caller keeps what was sent."""
    return Error(
        code=exc.kind,
        message=str(exc),
        retryable=exc.retryable,
        partial=True,
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
        kb=plan.kb,
        fell_back_from=tuple(attempts.passed),
        retried=tuple(attempts.retried),
    )


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


async def engine_failed(target: Target, exc: EngineError) -> None:
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
