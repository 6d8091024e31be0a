"""One target's try at an answer (`Attempt`): the prompt it is sent, laid out for the target's
window, the engine's stream, and what that stream's events become: the route at the first token,
the tokens, the done event (`done_event`). An attempt that continues an answer cut elsewhere
(routing.continuation) carries what the attempts before it produced (`Resumed`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from core import tracing
from inference_ops.client import Finish, stream_chat
from inference_ops.client import Token as EngineToken
from inference_ops.exceptions import EngineError
from routing import breaker
from routing.compiled import Target
from routing.events import Done, Event, Route, Token, route_event, usage_of
from routing.failures import Attempts
from routing.kb_records import record_miss
from routing.plan import Plan, question_message
from routing.prompt import approx_tokens, build_messages
from routing.spending import Meter
from spend import ledger


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def done_event(
    plan: Plan, target: Target, finish: Finish, attempts: Attempts, ttft: float | None
) -> Done:
    """The end of an answer `target` finished."""
    return Done(
        road=target.road,
        rule=plan.rule_name,
        target=target.endpoint,
        ttft_ms=ttft,
        latency_ms=ms(time.monotonic() - plan.started),
        usage=usage_of(finish),
        finish_reason=finish.finish_reason,
        citations=plan.citations,
        engine_ms=ms(finish.total),
        kb=plan.kb,
        fell_back_from=tuple(attempts.passed),
        finish_reasons=finish.finish_reasons if len(finish.finish_reasons) > 1 else None,
        system_fingerprint=finish.system_fingerprint,
        retried=tuple(attempts.retried),
        skipped_chunks=finish.skipped_chunks,
    )


@dataclass
class Resumed:
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


class Attempt:
    """One target's try at the answer: the prompt it is sent, the engine's stream, and what that
    stream's events become (the route at the first token, or at the end of an empty answer, the
    tokens, the done event). `generate` drives it: no generator layer of its own between the
    engine's stream and the caller, since every token passes through here."""

    def __init__(
        self,
        plan: Plan,
        target: Target,
        attempts: Attempts,
        meter: Meter,
        standing: ledger.Standing | None,
        *,
        resumed: Resumed | None = None,
    ):
        self.plan, self.target, self.attempts = plan, target, attempts
        self.meter, self.standing = meter, standing
        self.resumed = resumed  # continuing an answer cut elsewhere
        self.ttft: float | None = None
        self.dropped = 0  # history messages left out to fit the window
        self.text: list[str] = []  # the answer as the user gets it (placeholders put back)
        # The request's placeholders when this target gets the question redacted (routing.plan).
        self.redaction = plan.redaction_for(target)
        self.restorer = self.redaction.restorer() if self.redaction is not None else None
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
            question=question_message(request),
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
        if self.redaction is not None:
            # Last, so the prefill of an answer continued here is redacted too.
            messages = self.redaction.messages(messages, keep=self.target.personal_data)
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
        self.ttft = ms(time.monotonic() - self.plan.started)
        if self.chat and first_token:
            self.chat.first_chunk(engine_seconds)
        why = self.plan.why
        if self.plan.personal:
            spent = self.plan.request.spent
            if self.redaction is not None:
                spent.personal_data_action = "redacted"
                why = f"{why}; personal data ({', '.join(sorted(self.redaction.found))}) "
                why += f"sent to {self.target.endpoint} as placeholders"
            else:
                spent.personal_data_action = "local" if self.target.road == "local" else "sent"
        if self.resumed is not None:
            return self._continued_route(engine_seconds, why)
        return route_event(
            self.target,
            self.plan.rule_name,
            why,
            self.attempts.notes,
            self.dropped,
            retries=self.attempts.retry_notes() if self.attempts.retried else "",
            # A named request answered by a fallback was not answered by the model named.
            named=self.plan.named and self.target.endpoint == self.plan.request.model,
            engine_ms=ms(engine_seconds),
            standing=self.standing,
            context=self.plan.context,
        )

    def _continued_route(self, engine_seconds: float, why: str) -> Route:
        """The route of the answer's continuation: where it goes on, and where it was cut."""
        resumed, target = self.resumed, self.target
        assert resumed is not None
        same = target.endpoint == resumed.cut_at
        return Route(
            road=target.road,
            rule=self.plan.rule_name,
            target=target.endpoint,
            why=f"{why}. Continued on {target.endpoint} from where the stream was cut, "
            f"the partial answer sent as a prefill, after " + "; ".join(self.attempts.notes),
            reason="the answer was cut short and is continued by the "
            + ("same model" if same else f"{target.road} model"),
            engine_ms=ms(engine_seconds),
            standing=self.standing,
            continued_from=resumed.cut_at,
            context=self.plan.context,
        )

    def token(self, event: EngineToken) -> Token:
        """The engine's token as the user gets it: with the placeholders put back when the
        question went redacted (its text may then be empty: the start of a placeholder held)."""
        text = event.text if self.restorer is None else self.restorer.feed(event.text)
        self.text.append(text)
        if event.choices is not None:
            self.meter.extra(event.choices)  # noqa: S610 - the meter's own extra(), not QuerySet.extra
        return Token(text=text, choices=event.choices)

    async def finished(self, event: Finish) -> list[Event]:
        """The events that end the answer: the route, for an answer without a token, and done."""
        if self.chat:
            self.chat.finished(event.finish_reason, event.usage)
        await breaker.success(self.target.endpoint)
        self.meter.finish(event)
        ending: list[Event] = []
        if self.ttft is None:  # an answer without a token
            ending.append(self.route(event.total, first_token=False))
        if self.restorer is not None and (held := self.restorer.flush()):
            self.text.append(held)  # a "[" that began no placeholder after all
            ending.append(Token(text=held))
        plan, resumed = self.plan, self.resumed
        text = "".join(self.text) if resumed is None else "".join(resumed.text + self.text)
        if plan.direct is not None:
            record_miss(plan.request, plan.text, text, plan.direct)
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
