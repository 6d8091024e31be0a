"""What resuming a running answer costs the gateway: reconnects that join against reconnects that
do not, while answers stream.

The load, as phones and reloading pages make it: `answers` users each ask one long question on a
socket and close it once the answer is stored as started (the reload), so the answers run on with
no socket. Then, in rounds, three phases of the same length in turn, each measuring the gateway's
CPU (its web processes, from /proc):

- idle: nothing but the answers running (their cost per second, subtracted from the others);
- reconnect: `count` sockets of those users open and close again, as a page that reloads after
  its answer ended would (the handshake and the login check any reconnect pays);
- join: the same, but each sends `{"type": "join", "message_id": N}` for its user's running
  answer and closes once the `resume` frame (the text so far) is in.

The resume cost is the join phase's CPU less the reconnect phase's, per reconnect. With several
web processes a join lands on the answer's process or on another (then one Redis round trip),
as the kernel hands out connections.

No Django here: `manage.py bench_resume` makes the users, the cookies and the stack.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from benchmarks.chat_ws import CONNECT_TIMEOUT, ws_url

PHASES = ("idle", "reconnect", "join")


@dataclass
class Phase:
    kind: str
    count: int  # reconnects made (0 when idle)
    seconds: float
    cpu_ms: float  # the gateway's CPU over the phase
    waits: list[float] = field(default_factory=list)  # join sent -> resume frame in, seconds
    live: int = 0  # resume frames of an answer still running (`live: true`)
    texts: int = 0  # of those, with some text already (the reload's point)
    errors: Counter = field(default_factory=Counter)


async def _frame(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> dict:
    message = await ws.receive(timeout=timeout)
    if message.type != aiohttp.WSMsgType.TEXT:
        raise ConnectionError(f"socket {message.type.name.lower()} ({ws.close_code})")
    return json.loads(message.data)


async def _open(http: aiohttp.ClientSession, url: str, cookie: str):
    return await asyncio.wait_for(
        http.ws_connect(
            ws_url(url), headers={"Cookie": cookie, "Origin": url.rstrip("/")}, heartbeat=None
        ),
        CONNECT_TIMEOUT,
    )


async def answers_start(
    *, url: str, cookies: list[str], question: Callable[[int], str], timeout: float
) -> list[int]:
    """Each user asks one question and leaves once its first token is in (the answer is stored as
    started and goes on); returns the answers' message ids, in the cookies' order."""

    async def ask(index: int, http: aiohttp.ClientSession) -> int:
        ws = await _open(http, url, cookies[index])
        try:
            await ws.send_str(
                json.dumps({"type": "message", "session": None, "content": question(index)})
            )
            message_id = None
            while True:
                frame = await _frame(ws, timeout)
                if frame["type"] == "session":
                    message_id = frame["message_id"]
                elif frame["type"] == "token" and message_id is not None:
                    return message_id
                elif frame["type"] in ("done", "error"):
                    raise RuntimeError(f"the answer ended before the bench could join it: {frame}")
        finally:
            await ws.close()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return list(await asyncio.gather(*(ask(i, http) for i in range(len(cookies)))))


async def phase_run(
    *,
    kind: str,
    url: str,
    cookies: list[str],
    message_ids: list[int],
    count: int,
    concurrency: int,
    seconds: float,
    cpu: Callable[[], float],
    timeout: float,
) -> Phase:
    """One phase: `count` reconnects (joining or not) by `concurrency` clients at a time, or, idle,
    `seconds` of nothing. `cpu()` reads the gateway's CPU so far, in ms."""
    phase = Phase(kind=kind, count=0 if kind == "idle" else count, seconds=0.0, cpu_ms=0.0)
    jobs = iter(range(phase.count))

    async def client(http: aiohttp.ClientSession) -> None:
        for index in jobs:
            user = index % len(cookies)
            try:
                ws = await _open(http, url, cookies[user])
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                phase.errors[f"connect: {type(exc).__name__}"] += 1
                continue
            try:
                if kind == "join":
                    sent = time.perf_counter()
                    await ws.send_str(json.dumps({"type": "join", "message_id": message_ids[user]}))
                    frame = await _frame(ws, timeout)
                    if frame["type"] != "resume":
                        phase.errors[f"{frame['type']}:{frame.get('code')}"] += 1
                        continue
                    phase.waits.append(time.perf_counter() - sent)
                    phase.live += bool(frame["live"])
                    phase.texts += bool(frame["live"] and frame["text"])
            except (TimeoutError, ConnectionError, aiohttp.ClientError) as exc:
                phase.errors[f"{type(exc).__name__}: {exc}"[:80]] += 1
            finally:
                await ws.close()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        before, began = cpu(), time.perf_counter()
        if kind == "idle":
            await asyncio.sleep(seconds)
        else:
            await asyncio.gather(*(client(http) for _ in range(concurrency)))
        phase.seconds = time.perf_counter() - began
        phase.cpu_ms = cpu() - before
    return phase


def resume_cost(phases: list[Phase]) -> dict:
    """Per reconnect, the idle rate taken off: the reconnect's CPU, the join's, and their
    difference (what resuming adds), each a median over the rounds, with their range."""
    idle = [p for p in phases if p.kind == "idle"]
    rate = sum(p.cpu_ms for p in idle) / max(sum(p.seconds for p in idle), 1e-9)  # ms per second

    def per(kind: str) -> list[float]:
        return [(p.cpu_ms - rate * p.seconds) / p.count for p in phases if p.kind == kind]

    reconnect, join = per("reconnect"), per("join")
    added = [j - r for r, j in zip(reconnect, join, strict=False)]
    return {"idle_ms_per_s": rate, "reconnect": reconnect, "join": join, "added": added}
