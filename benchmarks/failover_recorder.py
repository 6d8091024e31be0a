"""What the providers of the failover scorecard saw (benchmarks.failover): a recording relay in
front of each simulator (`Recorder`) notes every attempt, when it came, what it asked (a prefill
continuation or not) and how it ended; from them the run counts the attempts per endpoint, the
waits between attempts and the time to the answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

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
