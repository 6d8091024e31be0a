"""What an answer costs: its share of the caller's limits reserved before a model is asked
(`reserve`, priced at the dearest target that may answer), and what it used, metered while it runs
(`Meter`), for the request log and the reservation's settlement.
"""

from __future__ import annotations

import time

from inference_ops.client import Finish
from inference_ops.exceptions import EngineError
from routing.compiled import Target
from routing.events import Error, Spent
from routing.plan import Plan
from routing.prompt import approx_tokens, prompt_tokens
from spend import engine_time, ledger
from spend.policy import Spec


async def reserve(plan: Plan, specs: tuple[Spec, ...]) -> ledger.Reservation | Error:
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


class Meter:
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
