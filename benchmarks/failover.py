"""The failover scorecard: what a caller gets from the gateway when the provider misbehaves.

Each scenario gives a primary and one fallback (two simulator processes, faults by model name:
`--fault MODEL=SPEC`) and is run twice through the real gateway over HTTP with the official
`openai` SDK streaming: **auto** (the client asks `auto`; a rule routes the question to the
primary, then the fallback) and **named** (the client names the primary's endpoint). The answers
are deterministic (a seeded simulator in random mode, `ignore_eos`, a fixed `max_tokens`), so
the whole answer is known before asking: the same request to a healthy simulator.

Each result is scored from the caller's side, as failoverbench scores it:

- **pass**: the whole answer, its usage adding up (for a content refusal: a clean error carrying
  the provider's reason);
- **partial**: an answer with a defect: repeated or lost text, usage missing or not adding up (or
  a content refusal hidden behind another provider's answer);
- **safe**: a clean error (an HTTP error other than 500, an error event, a dropped connection);
- **fail**: a hang past the deadline, a 500, a truncated answer presented as complete.

What the providers saw comes from a recording relay in front of each simulator (`Recorder`):
every attempt, when it came, what it asked (a prefill continuation or not), how it ended; from
them the attempts per endpoint, the waits between attempts and the time to the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace

import aiohttp
import httpx2
import openai
from aiohttp import web

from inference_ops.simulator.faults import parse_spec

VERDICTS = ("pass", "partial", "safe", "fail")  # best first
PRIMARY, FALLBACK = "primary", "fallback"
FALLBACK_MODEL = "fallback"  # the fallback simulator's healthy model
NO_PREFILL_MODEL = "fallback-no-prefill"
SEED = 20261206
REASON = "violence"
MODES = ("auto", "named")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    primary: str  # the primary's fault SPEC
    fallback: str | None = None  # the fallback's fault (None: healthy)
    kind: str = "answer"  # "answer", "refusal" (pass: a clean error with the reason), "flap"
    long_prompt: bool = False  # a prompt over the primary's window (context-length)
    primary_context_window: int = 4096
    accounting: bool = False  # usage must add every attempt's prompt


SCENARIOS = (
    Scenario("429-retry-after", "429 with Retry-After: 2, once", "429;retry-after=2;times=1"),
    Scenario("429-no-retry-after", "429 without Retry-After, once", "429;retry-after=none;times=1"),
    Scenario("500-once", "500 once", "500;times=1"),
    Scenario("503-always", "503 on every request", "503"),
    Scenario("reset", "connection reset before headers, once", "connect-close;times=1"),
    Scenario("no-response", "accepted, never answered", "hang"),
    Scenario("slow-first-token", "first token after 6 s", "slow-first-token;delay=6"),
    Scenario("cut-mid-stream", "connection cut after 8 tokens", "mid-stream;after=8;how=close"),
    Scenario("stall", "no token after the 8th, connection open", "stall;after=8"),
    Scenario("malformed-chunk", "one unreadable chunk after 8 tokens", "malformed;after=8"),
    Scenario("no-done", "stream ends after 8 tokens, no [DONE]", "no-done;after=8"),
    Scenario(
        "context-length",
        "prompt over the primary's 256-token window",
        "context-length;max-model-len=256",
        long_prompt=True,
        primary_context_window=256,
    ),
    Scenario(
        "content-filter",
        "content-policy refusal",
        f"content-filter;reason={REASON}",
        kind="refusal",
    ),
    Scenario(
        "prefill-refused",
        "cut after 8 tokens once; the fallback refuses prefill",
        "mid-stream;after=8;how=close;times=1",
        fallback="no-prefill",
    ),
    Scenario("flapping", "primary flaps: down 4 s, up 4 s", "flap;down=4;up=4", kind="flap"),
    Scenario(
        "accounting",
        "cut after 8 tokens: usage of every attempt",
        "mid-stream;after=8;how=close",
        accounting=True,
    ),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
QUICK = ("500-once", "cut-mid-stream", "no-done", "content-filter")


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...] = SCENARIOS
    max_tokens: int = 24
    deadline: float = 30.0  # per request, the whole answer, s
    first_token_timeout: float = 3.0  # the endpoints' (no-response, slow-first-token)
    idle_timeout: float = 2.0  # the endpoints' (stall)
    flap_seconds: float = 20.0  # how long the flapping scenario asks
    flap_interval: float = 1.0  # between its questions' starts
    ttft_ms: float = 20.0
    itl_ms: float = 10.0


def plan_quick(plan: Plan) -> Plan:
    """A short run for a test: four scenarios unless chosen, a shorter deadline and flap."""
    scenarios = plan.scenarios if plan.scenarios != SCENARIOS else tuple(BY_NAME[n] for n in QUICK)
    return replace(plan, scenarios=scenarios, deadline=20.0, flap_seconds=10.0)


def scenarios_pick(names: list[str]) -> tuple[Scenario, ...]:
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return tuple(BY_NAME[name] for name in names)


def model_of(scenario: Scenario, mode: str) -> str:
    """The primary simulator's model for a scenario and mode: each pair its own fault count."""
    return f"p-{scenario.name}-{mode}"


def endpoint_name(scenario: Scenario, mode: str, provider: str) -> str:
    return f"fo-{scenario.name}-{mode}" + ("-fb" if provider == FALLBACK else "")


def tag(scenario: Scenario, mode: str) -> str:
    # A word the rule's keyword matches (normalization drops punctuation), one per pair, none a
    # part of another.
    return f"zqfo{SCENARIOS.index(scenario):02d}{mode[0]}"


def simulator_args(plan: Plan, role: str) -> list[str]:
    """The flags of the primary or the fallback simulator: random mode (the text depends on the
    seed and the length only), its faults by model."""
    args = [
        "--mode",
        "random",
        "--time-to-first-token",
        f"{plan.ttft_ms:g}",
        "--inter-token-latency",
        f"{plan.itl_ms:g}",
    ]
    if role == PRIMARY:
        for scenario in plan.scenarios:
            for mode in MODES:
                args += ["--fault", f"{model_of(scenario, mode)}={scenario.primary}"]
    else:
        args += ["--fault", f"{NO_PREFILL_MODEL}=no-prefill"]
    return args


def messages_of(scenario: Scenario, mode: str) -> list[dict]:
    question = f"{tag(scenario, mode)} What does a lighthouse keeper do all day?"
    if scenario.long_prompt:
        question += " Some background:" + " the lamp was lit at dusk" * 60
    return [{"role": "user", "content": question}]


# --- the gateway's rows ---------------------------------------------------------------------------


def rows_create(*, plan: Plan, primary_url: str, fallback_url: str) -> None:
    """Per scenario and mode: a primary and a fallback endpoint (each its own breaker) and a rule
    taking the scenario's question to them in that order. Before the gateway starts."""
    from inference_ops.models import ModelEndpoint
    from routing.models import RouteTarget, RoutingRule

    names = [endpoint_name(s, m, p) for s in SCENARIOS for m in MODES for p in (PRIMARY, FALLBACK)]
    RoutingRule.objects.filter(name__startswith="failover ").delete()
    ModelEndpoint.objects.filter(name__in=names).delete()
    for scenario in plan.scenarios:
        for mode in MODES:
            timeouts = {
                "connect_timeout": 2.0,
                "first_token_timeout": plan.first_token_timeout,
                "idle_timeout": plan.idle_timeout,
                "total_timeout": plan.deadline,
            }
            primary = ModelEndpoint.objects.create(
                name=endpoint_name(scenario, mode, PRIMARY),
                kind=ModelEndpoint.Kind.VLLM,
                base_url=f"{primary_url}/v1",
                model=model_of(scenario, mode),
                context_window=scenario.primary_context_window,
                **timeouts,
            )
            fallback = ModelEndpoint.objects.create(
                name=endpoint_name(scenario, mode, FALLBACK),
                kind=ModelEndpoint.Kind.VLLM,
                base_url=f"{fallback_url}/v1",
                model=NO_PREFILL_MODEL if scenario.fallback == "no-prefill" else FALLBACK_MODEL,
                **timeouts,
            )
            rule = RoutingRule.objects.create(
                name=f"failover {scenario.name} {mode}",
                priority=1,
                keywords=[tag(scenario, mode)],
                use_kb_context=False,
            )
            RouteTarget.objects.create(rule=rule, position=1, endpoint=primary)
            RouteTarget.objects.create(rule=rule, position=2, endpoint=fallback)


# --- what the providers saw -----------------------------------------------------------------------

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Attempt:
    provider: str
    model: str | None
    at: float  # time.monotonic() of its arrival
    prefill: bool  # a continuation: continue_final_message
    body: dict = field(repr=False, default_factory=dict)
    status: int | None = None
    outcome: str = "open"  # ended, cut, reset, abandoned (the gateway hung up)
    ended: float | None = None


class Recorder:
    """A relay in front of one simulator that records every request it passes on, and passes
    each fault through as the simulator made it: a reset as a reset, a cut as a cut, silence as
    silence."""

    def __init__(self, provider: str, upstream: str):
        self.provider = provider
        self.upstream = upstream
        self.attempts: list[Attempt] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        attempt = Attempt(
            provider=self.provider,
            model=body.get("model"),
            at=time.monotonic(),
            prefill=bool(body.get("continue_final_message")),
            body=body,
        )
        if request.path.endswith("/chat/completions"):
            self.attempts.append(attempt)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        session = request.app["session"]
        try:
            url = self.upstream + request.path_qs
            async with session.post(url, data=raw, headers=headers) as up:
                attempt.status = up.status
                response = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS},
                )
                await response.prepare(request)
                try:
                    async for chunk in up.content.iter_any():
                        await response.write(chunk)
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                    attempt.outcome = "cut"
                    return await self._drop(request)
                attempt.outcome = "ended"
                return response
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError):
            attempt.outcome = "reset"
            return await self._drop(request)
        finally:
            if attempt.outcome == "open":
                attempt.outcome = "abandoned"
            attempt.ended = time.monotonic()

    @staticmethod
    async def _drop(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.close()
        await asyncio.sleep(5)  # cancelled as soon as aiohttp sees the connection gone
        raise ConnectionResetError("upstream dropped")


@contextlib.contextmanager
def recorders(upstreams: dict[str, str]) -> Iterator[dict[str, Recorder]]:
    """A Recorder per provider, served on loopback from a thread of its own (the gateway's
    requests reach them while the bench's client waits on its answers)."""
    ready: queue.Queue = queue.Queue()
    made = {name: Recorder(name, url) for name, url in upstreams.items()}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        runners = []
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        try:
            for recorder in made.values():
                app = web.Application()
                app["session"] = session
                app.router.add_route("*", "/{tail:.*}", recorder.handle)
                runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                recorder.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                runners.append(runner)
            ready.put(None)
            await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting thread
            ready.put(exc)
        finally:
            for runner in runners:
                await runner.cleanup()
            await session.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    started = ready.get(timeout=30)
    try:
        if isinstance(started, BaseException):
            raise RuntimeError(f"the recording relays did not start: {started}")
        yield made
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)


# --- what the caller got --------------------------------------------------------------------------


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


# --- one run --------------------------------------------------------------------------------------


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
    for before, after in zip(attempts, attempts[1:], strict=False):
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


# --- the report -----------------------------------------------------------------------------------


def _attempts_text(row: dict) -> str:
    counts = row["attempts"]
    text = f"{counts[PRIMARY]}/{counts[FALLBACK]}"
    if row["prefill_attempts"]:
        text += f" ({row['prefill_attempts']} prefill)"
    return text


def row_line(row: dict) -> str:
    gaps = ",".join(f"{g:g}" for g in row["gaps_s"][:3]) or "-"
    if len(row["gaps_s"]) > 3:
        gaps += f",…({len(row['gaps_s'])})"
    return (
        f"{row['scenario']:<20} {row['mode']:<6} {row['verdict']:<8} "
        f"{_attempts_text(row):<14} {gaps:<16} {row['time_s']:>6.2f}  {row['got']}"
    )


HEADER = (
    f"{'scenario':<20} {'mode':<6} {'verdict':<8} {'attempts p/f':<14} {'gaps s':<16} "
    f"{'time s':>6}  what the caller got"
)


def table_text(report: dict) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [row_line(row) for row in report["rows"]]
    lines.append("")
    for mode, counts in report["totals"].items():
        lines.append(f"{mode:<6} " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS))
    if line := continuation_line(report["rows"]):
        lines.append(line)
    return "\n".join(lines)


# Scenarios whose stream is cut at once (no idle timeout to wait out first) and then continued.
CUT_AT_ONCE = ("cut-mid-stream", "no-done", "accounting", "prefill-refused")


def continuation_line(rows: list[dict]) -> str | None:
    """A continuation's cost as the caller sees it: the longest wait between two tokens of the
    whole answers of the scenarios cut at once (from the last token before the cut to the first
    after it), their median and range."""
    gaps = sorted(
        r["longest_gap_s"]
        for r in rows
        if r["scenario"] in CUT_AT_ONCE
        and r["verdict"] == "pass"
        and r.get("prefill_attempts")
        and r.get("longest_gap_s") is not None
    )
    if not gaps:
        return None
    median = statistics.median(gaps)
    return (
        f"continued after a cut: the caller waited {median * 1000:.0f} ms from the last token "
        f"before it to the first after (median of {len(gaps)}; {gaps[0] * 1000:.0f}–"
        f"{gaps[-1] * 1000:.0f} ms)"
    )
