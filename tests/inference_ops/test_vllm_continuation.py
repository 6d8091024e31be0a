"""An answer cut mid-stream is finished by the real vLLM from where it was cut (issue 41, item 7).

The real engine is what these prove: it takes the partial answer as an assistant prefill
(`continue_final_message`) and goes on with the tokens it would have given anyway, so the
user's answer is the same, token for token, as the one no fault touched. Greedy decoding makes
that answer known: it is asked for once, uncut, through the same gateway.

Two cuts: a relay in front of the real vLLM that drops the connection after a few content
chunks (continued by the same engine, or by the next target of the chain), and the engine
itself SIGKILLed mid-answer (a second real vLLM of its own, continued by the shared one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from tests.inference_ops.engines import BASE, start_engine
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.engines

QUESTION = [{"role": "user", "content": "Count on: 1, 2, 3, 4,"}]
ANSWER_TOKENS = 24
CUT_AFTER = 5  # content chunks the relay lets through before it drops the connection
_CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with text (the first one's is empty)
TIMEOUTS = dict(first_token_timeout=60, idle_timeout=30, total_timeout=120)


class CuttingRelay:
    """An HTTP relay to an engine that drops the connection of each streamed answer after
    CUT_AFTER content chunks, unless the request continues an answer (a prefill), which it
    relays whole. Runs its own event loop in a thread, as the gateway under test runs in
    another process."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.cuts = 0
        self.continued = 0
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
                    if asked.get("stream") and not continuing and _CONTENT.search(line):
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


def _client(asgi_server: str, key: str):
    import openai

    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=180)


def _streamed(client, model: str) -> tuple[str, str | None, dict | None, list[str]]:
    """The answer's text, finish reason, usage and the endpoints that continued it (the final
    chunk's `gateway_continued`), streamed as a chat UI does."""
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        temperature=0,
        max_tokens=ANSWER_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, finish, usage, continued = [], None, None, []
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
        if chunk.usage:
            usage = chunk.usage.model_dump()
        continued += (chunk.model_extra or {}).get("gateway_continued") or []
    return "".join(text), finish, usage, continued


def _uncut(client) -> str:
    """The greedy answer no fault touched, through the same gateway (the fallback named)."""
    text, finish, usage, _ = _streamed(client, "whole")
    assert finish == "length" and usage and usage["completion_tokens"] == ANSWER_TOKENS
    return text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["same", "next"])
def test_an_answer_cut_mid_stream_is_finished_by_the_real_vllm_token_for_token(
    real_vllm, asgi_server, alice_key, where
):
    with CuttingRelay(real_vllm.url) as relay:
        # "same": the cut endpoint takes the continuation (it may be retried); "next": it may
        # not, so the chain's next target, the same engine reached directly, finishes it.
        cut = endpoint(
            "cut",
            url=relay.url + "/v1",
            model=BASE,
            retries=2 if where == "same" else 0,
            **TIMEOUTS,
        )
        whole = endpoint("whole", real_vllm, model=BASE, **TIMEOUTS)
        rule("default", cut, whole, is_default=True, use_kb_context=False)
        client = _client(asgi_server, alice_key)
        expected = _uncut(client)

        text, finish, usage, continued = _streamed(client, "auto")

    assert relay.cuts == 1 and relay.continued == (1 if where == "same" else 0)
    assert text == expected  # nothing lost, nothing repeated
    assert finish == "length"
    # Every attempt's tokens: those before the cut and those after add up to the ceiling.
    assert usage is not None and usage["completion_tokens"] == ANSWER_TOKENS
    assert continued == ["cut" if where == "same" else "whole"]


@contextlib.contextmanager
def _second_vllm(tmp_path, django_db_blocker) -> Iterator:
    with start_engine("vllm", tmp_path, django_db_blocker) as running:
        yield running


@pytest.mark.django_db(transaction=True)
def test_a_real_vllm_sigkilled_mid_answer_has_its_answer_finished_by_the_other(
    real_vllm, asgi_server, alice_key, tmp_path, django_db_blocker
):
    """The engine's process group killed after its first tokens: the answer goes on on the
    chain's next target (the shared real vLLM), from the text the user already has."""
    with _second_vllm(tmp_path, django_db_blocker) as doomed:
        killer = _KillAfterFirstTokens(doomed)
        with killer:
            first = endpoint("first", url=killer.url + "/v1", model=BASE, retries=0, **TIMEOUTS)
            whole = endpoint("whole", real_vllm, model=BASE, **TIMEOUTS)
            rule("default", first, whole, is_default=True, use_kb_context=False)
            client = _client(asgi_server, alice_key)
            expected = _uncut(client)
            text, finish, usage, continued = _streamed(client, "auto")
        assert killer.killed
    assert text == expected
    assert finish == "length" and usage is not None
    assert usage["completion_tokens"] == ANSWER_TOKENS
    assert continued == ["whole"]


class _KillAfterFirstTokens(CuttingRelay):
    """A relay that, instead of dropping the connection, SIGKILLs the engine's whole process
    group (its API server and EngineCore) once CUT_AFTER content chunks went through: the stream
    then breaks as a dead engine's does."""

    def __init__(self, engine):
        super().__init__(engine.url)
        self.engine = engine
        self.killed = False

    def cut(self) -> bool:
        if not self.killed:
            self.killed = True
            os.killpg(os.getpgid(self.engine.pid), signal.SIGKILL)
        return False  # the dead engine's stream breaks by itself, and so does the one relayed
