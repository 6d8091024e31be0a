"""One run of the failover scorecard (benchmarks.failover): every scenario of a plan in both
modes through the gateway, each answer scored (benchmarks.failover_caller) beside the attempts
the providers saw (benchmarks.failover_recorder), as one row per scenario and mode."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import aiohttp
import openai

from benchmarks.failover import (
    FALLBACK,
    FALLBACK_MODEL,
    MODES,
    PRIMARY,
    SEED,
    VERDICTS,
    Plan,
    Scenario,
    endpoint_name,
    messages_of,
)
from benchmarks.failover_caller import Expected, Outcome, ask, score, worst
from benchmarks.failover_recorder import Attempt, Recorder
from benchmarks.failover_report import row_line
from inference_ops.simulator.faults import parse_spec


@dataclass
class Bench:
    gateway_url: str
    api_key: str
    fallback_url: str  # the fallback simulator itself: the reference answers, the token counts
    recorders: dict[str, Recorder]
    say: Callable[[str], None] = lambda text: None
    _references: dict[str, Expected] = field(default_factory=dict)

    async def reference(self, messages: list, plan: Plan) -> Expected:
        """The whole answer: the same seeded request to a healthy simulator."""
        key = json.dumps(messages)
        if key not in self._references:
            body = {
                "model": FALLBACK_MODEL,
                "messages": messages,
                "seed": SEED,
                "max_tokens": plan.max_tokens,
                "ignore_eos": True,
            }
            answer = await self._post("/v1/chat/completions", body)
            self._references[key] = Expected(
                text=answer["choices"][0]["message"]["content"],
                tokens=answer["usage"]["completion_tokens"],
            )
        return self._references[key]

    async def prompt_tokens(self, attempts: list[Attempt]) -> int:
        """The prompt tokens of the attempts that were answered, as an engine counts them."""
        total = 0
        for attempt in attempts:
            if attempt.status != 200 or not isinstance(attempt.body.get("messages"), list):
                continue
            counted = await self._post(
                "/tokenize",
                {
                    "model": FALLBACK_MODEL,
                    "messages": attempt.body["messages"],
                    "add_generation_prompt": attempt.body.get("add_generation_prompt", True),
                    "continue_final_message": attempt.prefill,
                },
            )
            total += counted["count"]
        return total

    async def _post(self, path: str, body: dict) -> dict:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(self.fallback_url + path, json=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"{path}: {response.status} {await response.text()}")
                return await response.json()

    def attempts_between(self, start: float, end: float) -> list[Attempt]:
        attempts = [a for r in self.recorders.values() for a in r.attempts if start <= a.at <= end]
        return sorted(attempts, key=lambda a: a.at)

    async def run(self, plan: Plan) -> dict:
        # The SDK logs each request at INFO: the table is what this run prints.
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        client = openai.AsyncOpenAI(
            base_url=f"{self.gateway_url}/v1",
            api_key=self.api_key,
            max_retries=0,  # the gateway's retries are measured, not the SDK's
            timeout=plan.deadline,
        )
        rows = []
        try:
            for scenario in plan.scenarios:
                for mode in MODES:
                    if scenario.kind == "flap":
                        row = await self.flap(client, scenario, mode, plan)
                    else:
                        row = await self.one(client, scenario, mode, plan)
                    self.say(row_line(row))
                    rows.append(row)
        finally:
            await client.close()
        return {"rows": rows, "totals": totals(rows), "plan": plan_json(plan)}

    def _client_model(self, scenario: Scenario, mode: str) -> str:
        return "auto" if mode == "auto" else endpoint_name(scenario, mode, PRIMARY)

    async def one(self, client, scenario: Scenario, mode: str, plan: Plan) -> dict:
        messages = messages_of(scenario, mode)
        expected = await self.reference(messages, plan)
        outcome = await ask(
            client, model=self._client_model(scenario, mode), messages=messages, plan=plan
        )
        await asyncio.sleep(0.3)  # attempts still in flight reach their end on the relays
        attempts = self.attempts_between(outcome.started, outcome.started + outcome.elapsed)
        if scenario.accounting:
            expected = replace(expected, prompt_tokens=await self.prompt_tokens(attempts))
        verdict, got = score(outcome, expected=expected, kind=scenario.kind)
        return _row(scenario, mode, verdict, got, outcome, attempts)

    async def flap(self, client, scenario: Scenario, mode: str, plan: Plan) -> dict:
        """Questions one after another while the primary flaps: each must be answered whole;
        and once the primary is back up, how long until it answers again."""
        messages = messages_of(scenario, mode)
        expected = await self.reference(messages, plan)
        began = time.monotonic()
        verdicts, outcomes = [], []
        while time.monotonic() - began < plan.flap_seconds:
            outcome = await ask(
                client, model=self._client_model(scenario, mode), messages=messages, plan=plan
            )
            verdicts.append(score(outcome, expected=expected)[0])
            outcomes.append(outcome)
            await asyncio.sleep(max(0.0, plan.flap_interval - outcome.elapsed))
        await asyncio.sleep(0.3)
        attempts = self.attempts_between(began, time.monotonic())
        whole = verdicts.count("pass")
        back = _back_on_primary(attempts, down=parse_spec(scenario.primary).down)
        got = f"{whole} of {len(verdicts)} answered whole; " + (
            f"back on the primary {back:.1f} s after it recovered"
            if back is not None
            else "never back on the primary while it was up"
        )
        last = outcomes[-1]
        row = _row(scenario, mode, worst(verdicts), got, last, attempts)
        row["time_s"] = round(time.monotonic() - began, 2)
        row["back_on_primary_s"] = None if back is None else round(back, 2)
        row["questions"] = len(verdicts)
        return row


def _back_on_primary(attempts: list[Attempt], *, down: float) -> float | None:
    """Seconds from the primary's first recovery (its flap clock starts at its first request) to
    its first answered attempt after it; None if it answered none while up."""
    primary = [a for a in attempts if a.provider == PRIMARY]
    if not primary:
        return None
    recovered = primary[0].at + down
    answered = [
        a.at for a in primary if a.at >= recovered and a.status == 200 and a.outcome == "ended"
    ]
    return answered[0] - recovered if answered else None


def _row(scenario, mode, verdict, got, outcome: Outcome, attempts: list[Attempt]) -> dict:
    gaps = []
    for before, after in itertools.pairwise(attempts):
        gaps.append(round(after.at - (before.ended or before.at), 2))
    return {
        "scenario": scenario.name,
        "title": scenario.title,
        "mode": mode,
        "verdict": verdict,
        "got": got,
        "attempts": {
            provider: sum(1 for a in attempts if a.provider == provider)
            for provider in (PRIMARY, FALLBACK)
        },
        "prefill_attempts": sum(1 for a in attempts if a.prefill),
        "trace": [
            {
                "provider": a.provider,
                "at_s": round(a.at - outcome.started, 2),
                "status": a.status,
                "outcome": a.outcome,
                "prefill": a.prefill,
            }
            for a in attempts
        ],
        "gaps_s": gaps,
        "time_s": round(outcome.elapsed, 2),
        "ttft_s": None if outcome.ttft is None else round(outcome.ttft, 2),
        # For an answer cut and continued: the cut's whole cost as the caller saw it, from the
        # last token before it to the first after (the stall's includes its idle timeout).
        "longest_gap_s": None if outcome.longest_gap is None else round(outcome.longest_gap, 3),
        "caller": {
            k: v
            for k, v in asdict(outcome).items()
            if k not in ("started", "elapsed", "ttft", "longest_gap")
        },
    }


def totals(rows: list[dict]) -> dict:
    return {
        mode: {v: sum(1 for r in rows if r["mode"] == mode and r["verdict"] == v) for v in VERDICTS}
        for mode in MODES
    }


def plan_json(plan: Plan) -> dict:
    data = asdict(plan)
    data["scenarios"] = [s.name for s in plan.scenarios]
    return data
