"""What the caller of the failover scorecard got (benchmarks.failover): one streamed question
asked as an SDK user asks it, and its verdict, scored from the caller's side as failoverbench
scores it:

- **pass**: the whole answer, its usage adding up (for a content refusal: a clean error carrying
  the provider's reason);
- **partial**: an answer with a defect: repeated or lost text, usage missing or not adding up (or
  a content refusal hidden behind another provider's answer);
- **safe**: a clean error (an HTTP error other than 500, an error event, a dropped connection);
- **fail**: a hang past the deadline, a 500, a truncated answer presented as complete.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx2
import openai

from benchmarks.failover import REASON, SEED, VERDICTS, Plan


@dataclass
class Outcome:
    text: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    model: str | None = None
    error: str | None = None  # hang, status, stream_error, connection
    status: int | None = None
    message: str = ""
    started: float = 0.0
    elapsed: float = 0.0
    ttft: float | None = None
    longest_gap: float | None = None  # the longest wait between two chunks of text, seconds


async def ask(client: openai.AsyncOpenAI, *, model: str, messages: list, plan: Plan) -> Outcome:
    """One streamed question, as an SDK user asks it, read to its end or the deadline."""
    outcome = Outcome(started=time.monotonic())
    parts: list[str] = []
    last = outcome.started
    try:
        async with asyncio.timeout(plan.deadline):
            stream = await client.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=plan.max_tokens,
                seed=SEED,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                outcome.model = chunk.model or outcome.model
                if chunk.usage is not None:
                    outcome.usage = chunk.usage.model_dump(exclude_none=True)
                for choice in chunk.choices:
                    if choice.delta and choice.delta.content:
                        now = time.monotonic()
                        if outcome.ttft is None:
                            outcome.ttft = now - outcome.started
                        else:
                            outcome.longest_gap = max(outcome.longest_gap or 0.0, now - last)
                        last = now
                        parts.append(choice.delta.content)
                    if choice.finish_reason:
                        outcome.finish_reason = choice.finish_reason
    except TimeoutError:
        outcome.error = "hang"
    except openai.APIStatusError as exc:
        outcome.error, outcome.status, outcome.message = "status", exc.status_code, exc.message
    except openai.APIConnectionError as exc:
        outcome.error, outcome.message = "connection", str(exc)
    except openai.APIError as exc:  # an error event inside the stream
        outcome.error, outcome.message = "stream_error", exc.message
    except httpx2.HTTPError as exc:  # the connection broken while the stream was read
        outcome.error, outcome.message = "connection", f"{type(exc).__name__}: {exc}"
    outcome.text = "".join(parts)
    outcome.elapsed = time.monotonic() - outcome.started
    return outcome


@dataclass(frozen=True)
class Expected:
    text: str
    tokens: int
    prompt_tokens: int | None = None  # accounting: every attempt's prompt, summed


def score(outcome: Outcome, *, expected: Expected, kind: str = "answer") -> tuple[str, str]:
    """The verdict and what the caller got, in a few words."""
    chars = f"{len(outcome.text)} of {len(expected.text)} chars"
    if outcome.error == "hang":
        return "fail", f"no end within the deadline ({chars})"
    if outcome.error == "status" and outcome.status == 500:
        return "fail", f"500: {outcome.message[:80]}"
    if kind == "refusal":
        if outcome.error == "status" and 400 <= (outcome.status or 0) < 500:
            if REASON in outcome.message:
                return "pass", f"{outcome.status} with the provider's reason"
            return "safe", f"{outcome.status} without the provider's reason"
        if outcome.error:
            return "safe", f"{outcome.error}: {outcome.message[:80]}"
        return "partial", "an answer: the provider's refusal hidden"
    if outcome.error == "status":
        return "safe", f"{outcome.status}: {outcome.message[:80]}"
    if outcome.error:
        return "safe", f"{outcome.error} after {chars}: {outcome.message[:60]}"
    # The stream ended as if complete: its text must be the whole answer.
    if outcome.text == expected.text:
        return _usage_verdict(outcome, expected)
    if not outcome.text:
        return "fail", "an empty answer presented as complete"
    if expected.text.startswith(outcome.text):
        return "fail", f"truncated, presented as complete ({chars})"
    if len(outcome.text) > len(expected.text):
        return "partial", f"repeated text ({chars})"
    return "partial", f"lost text ({chars})"


def _usage_verdict(outcome: Outcome, expected: Expected) -> tuple[str, str]:
    usage = outcome.usage
    if not usage:
        return "partial", "whole answer, usage missing"
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if completion != expected.tokens:
        return "partial", f"whole answer, usage counts {completion} of {expected.tokens} tokens"
    if prompt is None or usage.get("total_tokens") != prompt + completion:
        return "partial", "whole answer, usage does not add up"
    if expected.prompt_tokens is not None and prompt != expected.prompt_tokens:
        return "partial", (
            f"whole answer, usage counts {prompt} prompt tokens, the attempts sent "
            f"{expected.prompt_tokens}"
        )
    return "pass", "whole answer, usage adds up"


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=VERDICTS.index) if verdicts else "fail"
