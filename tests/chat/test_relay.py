"""The gateway as a relay: every token of the engine's stream reaches every interface once and in
order, the usage and a mid-stream error come through, and streams do not hold database
connections (N concurrent streams on a pool smaller than N).

The engine is a stub whose stream is known to the byte (tests/support/stub_engine.py): bursts of
many chunks in one write, chunks cut across writes, CRLF line ends.
"""

import asyncio
import json

import aiohttp
import openai
import pytest
from django.test import Client

from chat.models import ChatSession, Message
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import (
    BROKEN_AFTER,
    PROMPT_TOKENS,
    SLOW_TOKENS,
    TOKENS,
    StubEngine,
    expected_text,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def engine():
    server = StubEngine().start()
    yield server
    server.stop()


@pytest.fixture
def roads(engine):
    """Endpoints named after the stub's behaviours. `model: auto` goes to the burst one when the
    question says "burst", to the slow one otherwise; each may be named (its own rule lists it)."""
    # The stub knows nothing of a prefill: no retry on the same endpoint and no fallback for a
    # named one, so a stream broken mid-answer is not continued (routing.continuation._continue).
    made = {
        name: endpoint(name, url=f"{engine.url}/v1", model=name, idle_timeout=5, retries=0)
        for name in ("burst", "broken", "slow")
    }
    rule(
        "by name",
        [(made[name], 100) for name in made],
        requested_models=list(made),
        priority=1,
        use_kb_context=False,
        pin_named=True,
    )
    rule("bursts", made["burst"], keywords=["burst"], priority=10, use_kb_context=False)
    rule("default", made["slow"], is_default=True, use_kb_context=False)
    return made


async def routable(base: str, key: str, names=("burst", "broken", "slow")) -> None:
    """Wait for the gateway to see the new rows: each process rereads the rules within a second."""
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=10)
    try:
        for _ in range(50):
            if set(names) <= {m.id for m in (await client.models.list()).data}:
                return
            await asyncio.sleep(0.1)
    finally:
        await client.close()
    raise AssertionError(f"the gateway never listed {names}")


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def test_v1_relays_every_token_once_in_order_with_the_usage_chunk(
    asgi_server, alice_key, roads
):
    await routable(asgi_server, alice_key)
    client = openai.AsyncOpenAI(
        base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0, timeout=30
    )
    stream = await client.chat.completions.create(
        model="burst",
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_text()
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (
        PROMPT_TOKENS,
        TOKENS,
    )


async def test_v1_passes_a_mid_stream_error_after_the_tokens_before_it(
    asgi_server, alice_key, alice, roads
):
    await routable(asgi_server, alice_key)
    session = await ChatSession.objects.acreate(user=alice)
    client = openai.AsyncOpenAI(
        base_url=f"{asgi_server}/v1",
        api_key=alice_key,
        max_retries=0,
        timeout=30,
        default_headers={"X-Session-Id": str(session.pk)},
    )
    stream = await client.chat.completions.create(
        model="broken", messages=[{"role": "user", "content": "count"}], stream=True
    )
    text = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            text.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    await client.close()
    assert "".join(text) == expected_text(BROKEN_AFTER)
    # The engine's own words are the operators' business: a user reads a plain message.
    assert "The model failed while answering" in str(info.value) and "fell over" not in str(
        info.value
    )
    stored = await Message.objects.aget(session__user=alice, role="assistant")
    assert (stored.status, stored.content) == ("partial", expected_text(BROKEN_AFTER))


async def test_the_sse_api_relays_every_token_once_in_order(asgi_server, alice, alice_key, roads):
    from asgiref.sync import sync_to_async

    from chat.services import session_create

    await routable(asgi_server, alice_key)
    session = await sync_to_async(session_create)(user=alice)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.post(
            f"{asgi_server}/api/chat/sessions/{session.pk}/messages/stream",
            json={"content": "count in a burst"},
            headers={"Authorization": f"Bearer {alice_key}"},
        ) as response:
            assert response.status == 200, await response.text()
            body = (await response.read()).decode()
    text, kinds = [], []
    for event in body.strip().split("\n\n"):
        kind, data = event.split("\n", 1)
        kinds.append(kind.removeprefix("event: "))
        if kinds[-1] == "token":
            text.append(json.loads(data.removeprefix("data: "))["text"])
    assert "".join(text) == expected_text()
    assert kinds[:2] == ["session", "route"] and kinds[-1] == "done"


async def test_the_browser_socket_relays_every_token_once_in_order(
    asgi_server, alice, alice_key, roads
):
    from asgiref.sync import sync_to_async

    await routable(asgi_server, alice_key)
    cookie = await sync_to_async(session_cookie)(alice)
    frames = await _socket_answer(asgi_server, cookie, "count in a burst")
    assert "".join(f["text"] for f in frames if f["type"] == "token") == expected_text()
    assert frames[-1]["type"] == "done" and frames[-1]["usage"]["completion_tokens"] == TOKENS


async def _socket_answer(base: str, cookie: str, question: str) -> list[dict]:
    frames = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.ws_connect(
            f"{base.replace('http', 'ws')}/ws/chat/",
            origin=base,
            headers={"Cookie": f"sessionid={cookie}"},
        ) as socket:
            await socket.send_json({"type": "message", "session": None, "content": question})
            while True:
                frame = json.loads((await socket.receive(timeout=30)).data)
                frames.append(frame)
                if frame["type"] in ("done", "error"):
                    return frames


# -- a pool smaller than the streams ---------------------------------------------------------------


@pytest.fixture
def small_pool_gateway(child_env, tmp_path):
    """A gateway process whose database pool has 2 connections and waits 1 s for one."""
    from benchmarks.servers import gateway

    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "DATABASE_POOL_SIZE": "2",
        "DATABASE_POOL_TIMEOUT": "1",
        "CHAT_RATE_LIMIT": "1000",
    }
    with gateway(env=env, log_path=tmp_path / "daphne.log") as server:
        yield server.url


async def test_streams_on_every_interface_outnumber_the_pool_and_all_complete(
    small_pool_gateway, alice, alice_key, roads
):
    """Each stream lasts twice the pool's wait: a stream that held its connection would make the
    third one fail."""
    from asgiref.sync import sync_to_async

    from chat.services import session_create

    base = small_pool_gateway
    await routable(base, alice_key)
    cookie = await sync_to_async(session_cookie)(alice)
    sessions = [await sync_to_async(session_create)(user=alice) for _ in range(2)]
    want = expected_text(SLOW_TOKENS)

    async def v1(model: str) -> str:
        client = openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key=alice_key, max_retries=0, timeout=30
        )
        try:
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"count for {model}"}],
                stream=True,
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        finally:
            await client.close()

    async def api(session_id: int, path: str) -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.post(
                f"{base}/api/chat/sessions/{session_id}/{path}",
                json={"content": "count"},
                headers={"Authorization": f"Bearer {alice_key}"},
            ) as response:
                body = await response.text()
                assert response.status in (200, 201), body
        if path == "messages/":
            return json.loads(body)["assistant_message"]["content"]
        return "".join(
            json.loads(e.split("\n", 1)[1].removeprefix("data: "))["text"]
            for e in body.strip().split("\n\n")
            if e.startswith("event: token")
        )

    async def socket() -> str:
        frames = await _socket_answer(base, cookie, "count on the socket")
        return "".join(f["text"] for f in frames if f["type"] == "token")

    results = await asyncio.gather(
        v1("slow"),
        v1("slow"),
        v1("auto"),
        api(sessions[0].pk, "messages/stream"),
        api(sessions[1].pk, "messages/"),
        socket(),
    )
    assert results == [want] * 6
