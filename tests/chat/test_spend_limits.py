"""Spend limits a client cannot get around: the rule's max_tokens is a ceiling on every interface,
and a user holds at most CHAT_MAX_STREAMS_PER_USER answers in flight, counted across processes.

The streams' test holds answers open on an engine that waits for the test's word after its first
token (no timing): a gateway process and this test process (the browser socket) take slots of one
user in the same Redis.
"""

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import aiohttp
import openai
import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from chat.models import ChatSession, Message
from tests.support.factories import endpoint, rule
from tests.support.sockets import socket_for
from tests.support.stub_engine import StubEngine, _chunk, _event

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 2


class GatedEngine(StubEngine):
    """An OpenAI-compatible engine that sends one token, then holds each answer until the test
    releases its question; it notes the max_tokens each question was sent with."""

    def __init__(self):
        super().__init__()
        self.max_tokens: dict[str, int | None] = {}
        self._gates: dict[str, asyncio.Event] = {}

    def _gate(self, question: str) -> asyncio.Event:
        return self._gates.setdefault(question, asyncio.Event())

    def release(self, question: str) -> None:
        self._loop.call_soon_threadsafe(lambda: self._gate(question).set())

    def stop(self) -> None:
        # Answers whose client went away still wait on their gate: let them end.
        self._loop.call_soon_threadsafe(lambda: [gate.set() for gate in self._gates.values()])
        super().stop()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        question = body["messages"][-1]["content"]
        self.max_tokens[question] = body.get("max_tokens")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_event(_chunk("gated", "held ")))
        await self._gate(question).wait()
        await response.write(_event(_chunk("gated", "done", finish="stop")) + b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
def gated():
    engine = GatedEngine().start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def capped_gateway(child_env, tmp_path_factory):
    """A gateway process whose users may hold CAP answers in flight."""
    from benchmarks.servers import gateway

    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "CHAT_MAX_STREAMS_PER_USER": str(CAP),
        "CHAT_RATE_LIMIT": "1000",
    }
    with gateway(env=env, log_path=tmp_path_factory.mktemp("capped") / "daphne.log") as server:
        yield server.url


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def capped_here(settings):
    settings.CHAT_MAX_STREAMS_PER_USER = CAP


@pytest.fixture
def held_rule(gated):
    """Every question goes to the gated engine, under a rule that caps answers at 64 tokens."""
    held = endpoint("held", url=f"{gated.url}/v1", model="gated")
    return rule("default", held, is_default=True, use_kb_context=False, max_tokens=64)


@pytest.fixture
def bob_key(bob):
    from chat.apikeys import apikey_create

    return apikey_create(user=bob, name="bob's", scopes=["chat"])[1]


def v1_client(base, key):
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def post_json(url, body: dict, key: str):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def sse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def frame_of_type(socket, *types, timeout=20):
    while True:
        frame = await socket.receive_json_from(timeout=timeout)
        if frame["type"] in types:
            return frame


# --- max_tokens: the rule's value is a ceiling ----------------------------------------------------


@pytest.fixture
def paid_rule(external_sim):
    """The external simulator generates exactly the max_tokens it is sent."""
    paid = endpoint("paid", external_sim, kind="external")
    return rule("default", paid, is_default=True, use_kb_context=False, max_tokens=5)


async def test_v1_gives_a_client_asking_for_more_than_the_rules_max_tokens_the_rules(
    asgi_server, alice_key, paid_rule
):
    client = v1_client(asgi_server, alice_key)
    completion = await client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "Write me a very long essay"}],
        max_tokens=4000,
    )
    assert (
        completion.usage.completion_tokens == 5 and completion.choices[0].finish_reason == "length"
    )
    stream = await client.chat.completions.create(
        model="paid",
        messages=[{"role": "user", "content": "Write me a very long essay"}],
        stream=True,
        max_completion_tokens=4000,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage.completion_tokens == 5
    small = await client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "Write me a line"}], max_tokens=3
    )
    assert small.usage.completion_tokens == 3
    await client.close()


async def test_the_drf_stream_gives_a_client_asking_for_more_than_the_rules_max_tokens_the_rules(
    asgi_server, alice, alice_key, paid_rule
):
    session = await ChatSession.objects.acreate(user=alice)
    status, _, text = await sync_to_async(post_json)(
        f"{asgi_server}/api/chat/sessions/{session.pk}/messages/stream",
        {"content": "Write me a very long essay", "max_tokens": 4000},
        alice_key,
    )
    assert status == 200, text
    name, done = sse_events(text)[-1]
    assert name == "done" and done["usage"]["completion_tokens"] == 5


async def test_the_socket_answers_with_the_rules_max_tokens(alice, paid_rule):
    socket = await socket_for(alice, connect=True)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "Write me a very long essay"}
    )
    done = await frame_of_type(socket, "done", "error")
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 5
    await socket.disconnect()


async def test_the_engine_is_sent_the_rules_max_tokens_when_a_client_asks_for_more(
    asgi_server, alice_key, gated, held_rule
):
    gated.release("How many tokens may I have?")
    client = v1_client(asgi_server, alice_key)
    await client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "How many tokens may I have?"}],
        max_tokens=32768,
    )
    assert gated.max_tokens["How many tokens may I have?"] == 64
    await client.close()


# --- streams in flight: at most CAP per user, across processes ------------------------------------


async def test_a_user_holds_at_most_cap_streams_across_processes_and_gets_one_back_when_one_ends(
    capped_gateway, capped_here, alice, alice_key, bob_key, gated, held_rule
):
    client = v1_client(capped_gateway, alice_key)

    # One answer in flight through the gateway process, one through this process's socket.
    first = await client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "first"}], stream=True
    )
    assert (await anext(aiter(first))).choices is not None  # the turn started: its slot is taken
    socket = await socket_for(alice, connect=True)
    await socket.send_json_to({"type": "message", "session": None, "content": "second"})
    assert (await frame_of_type(socket, "token", "error"))["type"] == "token"

    # The third is refused, on every interface, in its own shape.
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "third"}], stream=True
        )
    error = refused.value.body
    assert error["code"] == "too_many_streams" and error["type"] == "rate_limit_error"
    assert f"at most {CAP}" in error["message"]
    assert int(refused.value.response.headers["Retry-After"]) >= 1

    session = await ChatSession.objects.acreate(user=alice)
    status, headers, text = await sync_to_async(post_json)(
        f"{capped_gateway}/api/chat/sessions/{session.pk}/messages/stream",
        {"content": "third"},
        alice_key,
    )
    assert status == 429 and json.loads(text)["error"]["code"] == "too_many_streams"
    assert int(headers["Retry-After"]) >= 1

    other = await socket_for(alice, connect=True)
    await other.send_json_to({"type": "message", "session": None, "content": "third"})
    frame = await frame_of_type(other, "error", "token")
    assert (
        frame["type"] == "error"
        and frame["code"] == "too_many_streams"
        and frame["retry_after"] >= 1
    )

    # Another user is not held back by alice's streams.
    bob_client = v1_client(capped_gateway, bob_key)
    bobs = await bob_client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "bob's"}], stream=True
    )
    await anext(aiter(bobs))
    gated.release("bob's")
    [chunk async for chunk in bobs]

    # One of alice's answers ends: she may start another one.
    gated.release("first")
    assert (
        "".join([c.choices[0].delta.content or "" async for c in first if c.choices]) == "held done"
    )
    gated.release("fourth")
    fourth = await client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "fourth"}]
    )
    assert fourth.choices[0].message.content == "held done"

    gated.release("second")
    assert (await frame_of_type(socket, "done", "error"))["type"] == "done"
    for closing in (socket, other):
        await closing.disconnect()
    await client.close()
    await bob_client.close()


async def test_a_stream_stopped_by_its_user_gives_its_slot_back(
    capped_here, alice, gated, held_rule
):
    socket = await socket_for(alice, connect=True)
    for _ in range(CAP + 1):  # more stops than slots: each stop gave its slot back
        await socket.send_json_to({"type": "message", "session": None, "content": "stopped"})
        assert (await frame_of_type(socket, "token", "error"))["type"] == "token"
        await socket.send_json_to({"type": "stop"})
        assert (await frame_of_type(socket, "error"))["code"] == "cancelled"
    gated.release("kept")
    await socket.send_json_to({"type": "message", "session": None, "content": "kept"})
    assert (await frame_of_type(socket, "done", "error"))["type"] == "done"
    await socket.disconnect()


async def test_an_answer_whose_socket_went_away_keeps_its_slot_until_it_ends(
    capped_here, alice, gated, held_rule
):
    """The answer goes on without its socket (a reload joins it: chat.live), so it still holds
    its slot; when it ends, the slot comes back."""
    for _ in range(CAP):
        socket = await socket_for(alice, connect=True)
        await socket.send_json_to({"type": "message", "session": None, "content": "abandoned"})
        assert (await frame_of_type(socket, "token", "error"))["type"] == "token"
        await socket.disconnect()
    socket = await socket_for(alice, connect=True)
    await socket.send_json_to({"type": "message", "session": None, "content": "kept"})
    refused = await frame_of_type(socket, "done", "error")
    assert refused["code"] == "too_many_streams", refused
    gated.release("abandoned")
    gated.release("kept")
    for _ in range(100):
        if not await Message.objects.filter(status="streaming").aexists():
            break
        await asyncio.sleep(0.05)
    await socket.send_json_to({"type": "message", "session": None, "content": "kept"})
    assert (await frame_of_type(socket, "done", "error"))["type"] == "done"
    await socket.disconnect()


async def test_a_v1_client_that_hangs_up_mid_stream_gives_its_slot_back(
    capped_gateway, alice_key, gated, held_rule
):
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hung up"}]}

    async def hang_up_mid_answer() -> int:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.post(
                f"{capped_gateway}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {alice_key}"},
            ) as response:
                if response.status == 200:
                    await response.content.readline()  # the first chunk: the answer is running
                else:
                    assert (await response.json())["error"]["code"] == "too_many_streams"
                return response.status
        # Closed here, mid-answer: the gateway ends the turn when it hears the hang-up.

    # More hang-ups than slots, each accepted once the gateway heard the earlier ones: a slot
    # that a hang-up did not give back would refuse the last ones for good.
    for _ in range(CAP + 1):
        for _ in range(300):
            if await hang_up_mid_answer() == 200:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("a hung-up stream kept its slot")


# --- the settings, parsed strictly ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"CHAT_MAX_STREAMS_PER_USER": "0"}, "CHAT_MAX_STREAMS_PER_USER must be at least 1"),
        ({"CHAT_MAX_STREAMS_PER_USER": "many"}, "CHAT_MAX_STREAMS_PER_USER must be a whole number"),
        (
            {"ROUTING_MAX_TOKENS_CEILING": "256", "ROUTING_DEFAULT_MAX_TOKENS": "512"},
            "ROUTING_MAX_TOKENS_CEILING (256) must be at least ROUTING_DEFAULT_MAX_TOKENS (512)",
        ),
    ],
)
def test_a_limit_that_makes_no_sense_stops_start_up_naming_it(child_env, variables, message):
    result = subprocess.run(
        [sys.executable, "-c", "import config.settings"],
        cwd=settings.BASE_DIR,
        env={**child_env, **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and message in result.stderr, result.stderr
