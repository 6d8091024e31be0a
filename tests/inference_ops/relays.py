"""Relays in front of an engine that cut an answer mid-stream, for the continuation tests (by
dropping the connection, or by killing a supervised engine, which its supervisor starts again),
and the answer read as a client reads it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time

import aiohttp
from aiohttp import web
from django.db import connection

from core.processes import free_port
from inference_ops import engine_processes
from inference_ops.models import EngineProcess, ModelEndpoint
from tests.support.factories import rule
from tests.support.polling import wait_until

QUESTION = [{"role": "user", "content": "Count on: 1, 2, 3, 4,"}]
ANSWER_TOKENS = 24
CUT_AFTER = 5  # content chunks a relay lets through before it cuts
_CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with text (the first one's is empty)


class CuttingRelay:
    """An HTTP relay to an engine that drops the connection of each streamed answer after
    CUT_AFTER content chunks, unless the request continues an answer (a prefill), which it
    relays whole. Runs its own event loop in a thread, as the gateway under test runs in
    another process."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.cuts = 0
        self.continued = 0
        self.armed = True  # False: every answer relayed whole
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CuttingRelay:
        self._thread.start()
        assert self._ready.wait(10), "the relay did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._relay)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

    def cut(self) -> bool:
        """CUT_AFTER content chunks went through: True drops the connection now."""
        self.cuts += 1
        return True

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        asked = json.loads(body) if body else {}
        continuing = bool(asked.get("continue_final_message"))
        self.continued += continuing
        cutting = self.armed and asked.get("stream") and not continuing
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("content-type", "authorization")
        }
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers
            ) as upstream,
        ):
            reply = web.StreamResponse(status=upstream.status)
            reply.content_type = upstream.content_type
            await reply.prepare(request)
            content, broken = 0, False
            try:
                async for line in upstream.content:
                    await reply.write(line)
                    if cutting and _CONTENT.search(line):
                        content += 1
                        if content == CUT_AFTER and self.cut():
                            break
            except aiohttp.ClientError:
                broken = True  # the engine's stream broke
            if broken or content >= CUT_AFTER:
                assert request.transport is not None
                request.transport.close()  # no [DONE], no finish reason: cut
            else:
                await reply.write_eof()
            return reply


class KillingRelay(CuttingRelay):
    """A relay to a supervised engine (an EngineProcess row) that, once CUT_AFTER content chunks
    went through, SIGKILLs the engine's process group (its API server and EngineCore) and waits
    until it is dead; the stream then breaks as a dead engine's does. The rest is the gateway's and
    the supervisor's, as in production: the failure reported, the check (a Celery task) finding
    the engine dead, its restart."""

    def __init__(self):
        self.engine_port = free_port()  # the engine's, which the row gets (`supervised`)
        super().__init__(f"http://127.0.0.1:{self.engine_port}")
        self.engine: EngineProcess | None = None  # set once the row exists
        self.killed_pid: int | None = None

    def cut(self) -> bool:
        if self.engine is not None and self.killed_pid is None:
            # In a thread (no ORM on an event loop), waited for: the relay reads on once the
            # engine is dead, not dying.
            killing = threading.Thread(target=self._kill, daemon=True)
            killing.start()
            killing.join(30)
        return False  # the dead engine's stream breaks by itself, and so does the one relayed

    def _kill(self) -> None:
        assert self.engine is not None
        try:
            pid = EngineProcess.objects.values_list("pid", flat=True).get(pk=self.engine.pk)
        finally:
            connection.close()  # this thread's own connection
        assert pid is not None
        self.killed_pid = pid
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        assert wait_until(lambda: not engine_processes.process_alive(pid), timeout=10)


def supervised(
    relay: KillingRelay, *, model: str, endpoint_fields: dict, **engine_fields
) -> EngineProcess:
    """An engine row of the supervisor's on the relay's engine port, its endpoint (which may be
    tried again: a continuation goes to it first) reached through the relay, the default rule's
    only target."""
    endpoint = ModelEndpoint.objects.create(
        name="own",
        kind="vllm",
        base_url=f"{relay.url}/v1",
        model=model,
        **{"connect_timeout": 1, "total_timeout": 120, "retries": 1, **endpoint_fields},
    )
    engine = EngineProcess.objects.create(
        **{"name": "own", "model": model, **engine_fields},
        endpoint=endpoint,
        port=relay.engine_port,
    )
    relay.engine = engine
    rule("default", endpoint, is_default=True, use_kb_context=False)
    return engine


def sdk_client(asgi_server: str, key: str, timeout: float = 180):
    import openai

    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=timeout)


def streamed(
    client, model: str, gaps: list[float] | None = None, **more
) -> tuple[str, str | None, dict | None, list[str]]:
    """The answer's text, finish reason, usage and the endpoints that continued it (the final
    chunk's `gateway_continued`), streamed as a chat UI does. `more`: other fields of the body
    (a seed for the simulator, whose seeded answer is as fixed as a greedy one). `gaps` gets the
    seconds between chunks with text, for a benchmark's print (never asserted)."""
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        temperature=0,
        max_tokens=ANSWER_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **more},
    )
    text, finish, usage, continued = [], None, None, []
    last = None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content and gaps is not None:
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
        if chunk.usage:
            usage = chunk.usage.model_dump()
        continued += (chunk.model_extra or {}).get("gateway_continued") or []
    return "".join(text), finish, usage, continued
