"""What a tool-call stream costs the gateway against a text stream of the same length
(`manage.py bench_tools`).

The gateway writes a chunk that holds only the first choice's text from a template; a tool call's
chunks (ids, names, argument fragments) are relayed as the engine's own choice objects, parsed
and dumped again. Both kinds of answer are streamed through /v1 with the endpoint named
(`model: "local"`: no KB), usage included:

- tool: `TOOL`, a function whose `parameters` make the simulated model write a call of a few
  hundred tokens, with `tool_choice` naming it;
- text: no tools, `max_tokens` the tool call's completion tokens and `ignore_eos`, so the answer
  is exactly as long (in tokens; the text has a chunk per token, the call a few less, as vLLM's
  parser sends nothing for `<tool_call>` and the closing tokens).

In each phase `requests` streams run, `concurrency` at a time (a closed loop), and the gateway's
CPU (its web processes, user + system, from /proc) is read around it. A request fails unless its
stream ends with [DONE] and no error, and delivers what was asked: the text its `max_tokens`
long, the call one call of `TOOL` whose arguments are valid for its schema.

No Django here: `manage.py bench_tools` makes the stack and the key.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import jsonschema
import orjson

from benchmarks.stats import percentile

PHASES = ("text", "tool")
TARGET = 1.1  # the issue's: a tool-call stream's gateway CPU at most 1.1x a text stream's
TOOL_NAME = "file_ticket"
# Objects, arrays, strings, integers, an enum and a formatted string: every kind of fragment a
# real call streams. The simulated model fills each property (strings from its text: see `seed`
# below), so every call is of one length.
PARAMETERS = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 12},
        "summary": {"type": "string"},
        "product": {"type": "string"},
        "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
        "severity": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 4},
        "expected": {"type": "string"},
        "actual": {"type": "string"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "account": {"type": "integer", "minimum": 1000},
            },
            "required": ["name", "email", "account"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 3},
    },
    "required": ["title", "summary", "product", "severity", "priority", "steps", "customer"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "File a support ticket for the customer's problem.",
        "parameters": PARAMETERS,
    },
}
TOOL_CHOICE = {"type": "function", "function": {"name": TOOL_NAME}}
# The call is a few hundred tokens: this only keeps a call that never ends from running on.
TOOL_MAX_TOKENS = 1024
_VALIDATOR = jsonschema.Draft202012Validator(PARAMETERS)


def question(index: int) -> list[dict]:
    # A reference per request, as the load generator adds: no cache can answer from another one.
    return [
        {
            "role": "user",
            "content": f"My order page shows an error after the last update, please file a "
            f"ticket (ref. {index})",
        }
    ]


def request_body(*, kind: str, index: int, tokens: int, model: str = "local") -> dict:
    """The streamed request of phase `kind`: the tool call, or `tokens` tokens of text."""
    body: dict = {
        "model": model,
        "messages": question(index),
        "stream": True,
        "stream_options": {"include_usage": True},
        # The same words every time: the simulated model fills the call's strings from its text,
        # so a seed makes every call as long as the first.
        "seed": 0,
    }
    if kind == "tool":
        body.update(tools=[TOOL], tool_choice=TOOL_CHOICE, max_tokens=TOOL_MAX_TOKENS)
    else:
        body.update(max_tokens=tokens, ignore_eos=True)
    return body


@dataclass
class Outcome:
    """What the client saw of one stream."""

    error: str | None = None  # None: it delivered what was asked
    ttft: float | None = None  # seconds to the first chunk with text or a tool call
    end: float = 0.0  # seconds to the end of the stream
    tokens: int | None = None  # completion tokens, from the usage chunk
    chunks: int = 0  # chunks with text or a tool call
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict] = field(default_factory=dict)  # index -> {"name", "arguments"}
    finish_reason: str | None = None


def _error_code(chunk: dict) -> str:
    error = chunk.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return f"stream_error:{code}" if code else "stream_error"


async def stream_one(
    session: aiohttp.ClientSession, *, url: str, key: str, body: dict, timeout: float
) -> Outcome:
    """One streamed chat completion through the gateway at `url`; never raises for what the
    gateway or the network did. Every chunk is parsed (both phases alike), so the call can be
    put together and checked."""
    out = Outcome()
    start = time.perf_counter()
    done = False
    try:
        async with session.post(
            f"{url}/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            if response.status != 200:
                out.error = f"http_{response.status}"
                return out
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                chunk = orjson.loads(payload)
                if "error" in chunk:
                    out.error = _error_code(chunk)
                    return out
                if chunk.get("usage"):
                    out.tokens = chunk["usage"].get("completion_tokens")
                said = False
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if content := delta.get("content"):
                        out.text.append(content)
                        said = True
                    for call in delta.get("tool_calls") or ():
                        into = out.calls.setdefault(
                            call.get("index") or 0, {"name": "", "arguments": ""}
                        )
                        function = call.get("function") or {}
                        into["name"] += function.get("name") or ""
                        into["arguments"] += function.get("arguments") or ""
                        said = True
                    if choice.get("finish_reason"):
                        out.finish_reason = choice["finish_reason"]
                if said:
                    out.chunks += 1
                    if out.ttft is None:
                        out.ttft = time.perf_counter() - start
    except TimeoutError:
        out.error = "timeout"
    except aiohttp.ClientError:
        out.error = "connection_error"
    except orjson.JSONDecodeError:
        out.error = "malformed_chunk"
    finally:
        out.end = time.perf_counter() - start
    if out.error is None and not done:
        out.error = "missing_done"
    return out


def delivered(out: Outcome, *, kind: str, tokens: int) -> str | None:
    """Why a stream that ended cleanly did not deliver what phase `kind` asked; None if it did."""
    if out.error is not None:
        return out.error
    if kind == "text":
        if not out.text or out.calls:
            return "no_text"
        if out.tokens != tokens:
            return f"text_of_{out.tokens}_tokens"
        return None
    if list(out.calls) != [0] or out.calls[0]["name"] != TOOL_NAME:
        return "no_call"
    try:
        arguments = orjson.loads(out.calls[0]["arguments"])
    except orjson.JSONDecodeError:
        return "arguments_not_json"
    if not _VALIDATOR.is_valid(arguments):
        return "arguments_invalid"
    return None


@dataclass
class Phase:
    kind: str  # "text" or "tool"
    concurrency: int
    round: int
    requests: int
    seconds: float = 0.0  # the makespan: first request sent to last stream ended
    cpu_ms: float = 0.0  # the gateway's CPU over the phase
    ttfts: list[float] = field(default_factory=list)  # seconds, delivered requests
    tokens: list[int] = field(default_factory=list)  # completion tokens, delivered requests
    chunks: list[int] = field(default_factory=list)  # chunks with content, delivered requests
    errors: Counter = field(default_factory=Counter)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_ms / self.requests

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "concurrency": self.concurrency,
            "round": self.round,
            "requests": self.requests,
            "failed": self.failed,
            "errors": dict(self.errors),
            "seconds": self.seconds,
            "cpu_ms": self.cpu_ms,
            "cpu_ms_per_request": self.cpu_per_request,
            "ttft_p50_ms": 1000 * percentile(self.ttfts, 0.5),
            "ttft_p99_ms": 1000 * percentile(self.ttfts, 0.99),
            "completion_tokens": [min(self.tokens), max(self.tokens)] if self.tokens else None,
            "chunks_per_request": sum(self.chunks) / len(self.chunks) if self.chunks else None,
            "output_tokens_per_s": self.tokens_per_s,
        }


def _session() -> aiohttp.ClientSession:
    # limit=0: every stream in flight has its own connection. A long chunk must fit the buffer.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), read_bufsize=2**20)


async def phase_run(
    *,
    kind: str,
    url: str,
    key: str,
    concurrency: int,
    requests: int,
    tokens: int,
    cpu: Callable[[], float],
    timeout: float,
    round_number: int = 1,
    first_index: int = 0,
) -> Phase:
    """`requests` streams of phase `kind`, `concurrency` at a time; `cpu()` reads the gateway's
    CPU so far, in ms. `tokens`: the tool call's completion tokens, the text's length."""
    phase = Phase(kind=kind, concurrency=concurrency, round=round_number, requests=requests)
    jobs = iter(range(first_index, first_index + requests))

    async def client(session: aiohttp.ClientSession) -> None:
        # One shared iterator: each client takes the next request as soon as its own ends.
        for index in jobs:
            body = request_body(kind=kind, index=index, tokens=tokens)
            out = await stream_one(session, url=url, key=key, body=body, timeout=timeout)
            if (why := delivered(out, kind=kind, tokens=tokens)) is not None:
                phase.errors[why] += 1
                continue
            phase.ttfts.append(out.ttft or 0.0)
            phase.tokens.append(out.tokens or 0)
            phase.chunks.append(out.chunks)

    async with _session() as session:
        before, began = cpu(), time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(min(concurrency, requests))))
        phase.seconds = time.perf_counter() - began
        phase.cpu_ms = cpu() - before
    return phase


async def tool_call_length(*, url: str, key: str, calls: int, timeout: float) -> list[Outcome]:
    """`calls` tool calls one after another (they also warm the gateway up): what each
    delivered, its completion tokens from the usage the engine reported."""
    outcomes = []
    async with _session() as session:
        for index in range(calls):
            body = request_body(kind="tool", index=-1 - index, tokens=0)
            outcomes.append(await stream_one(session, url=url, key=key, body=body, timeout=timeout))
    return outcomes


async def engine_ttfts(
    *, url: str, model: str, tokens: int, count: int, timeout: float
) -> dict[str, list[float]]:
    """The engine's own TTFT of each kind, reached directly, one stream at a time: a call's first
    chunk comes once its name is whole, some tokens in (vLLM's Hermes parser), which the
    gateway's TTFT then includes too."""
    ttfts: dict[str, list[float]] = {kind: [] for kind in PHASES}
    async with _session() as session:
        for index in range(count):
            for kind in PHASES:
                body = request_body(kind=kind, index=-100 - index, tokens=tokens, model=model)
                out = await stream_one(session, url=url, key="-", body=body, timeout=timeout)
                if delivered(out, kind=kind, tokens=tokens) is None and out.ttft is not None:
                    ttfts[kind].append(out.ttft)
    return ttfts


def order(round_number: int) -> tuple[str, str]:
    """ABBA: text then tool in odd rounds, tool then text in even ones, so that a drift of the
    machine over the run weighs on both alike."""
    return PHASES if round_number % 2 else PHASES[::-1]


def level_summary(phases: list[Phase]) -> dict:
    """One level's rounds: per round the CPU per request of each phase and their ratio tool/text,
    then the medians over the rounds with their ranges (min, max)."""
    rounds = sorted({p.round for p in phases})
    by = {(p.round, p.kind): p for p in phases}
    text = [by[r, "text"].cpu_per_request for r in rounds]
    tool = [by[r, "tool"].cpu_per_request for r in rounds]
    ratio = [b / a if a else float("nan") for a, b in zip(text, tool)]

    def spread(values: list[float]) -> dict:
        return {"median": percentile(values, 0.5), "min": min(values), "max": max(values)}

    def of(kind: str, figure: Callable[[Phase], float]) -> dict:
        return spread([figure(by[r, kind]) for r in rounds])

    return {
        "rounds": len(rounds),
        "text_cpu_ms": spread(text),
        "tool_cpu_ms": spread(tool),
        "ratio": spread(ratio),
        "ratios": ratio,
        "ttft_p50_ms": {
            kind: of(kind, lambda p: 1000 * percentile(p.ttfts, 0.5)) for kind in PHASES
        },
        "output_tokens_per_s": {kind: of(kind, lambda p: p.tokens_per_s) for kind in PHASES},
        "makespan_s": {kind: of(kind, lambda p: p.seconds) for kind in PHASES},
        "failed": sum(p.failed for p in phases),
        "requests": sum(p.requests for p in phases),
    }


def target_met(summary: dict) -> bool:
    return summary["ratio"]["median"] <= TARGET
