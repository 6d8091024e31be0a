"""Graceful drain (config.drain): a real gateway process, a slow engine stream in flight, a real
SIGTERM. The process stops taking chats at once and lets the running stream finish, or, once
WEB_DRAIN_SECONDS are over, ends it with a `shutdown` event and stores it as partial."""

import asyncio
import contextlib
import json
import re
import signal
import time

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import Client

from benchmarks.servers import gateway
from chat.models import ChatSession, Message
from observability.models import RequestLog
from tests.support.factories import endpoint, rule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# The engine's pace: a long answer lasts seconds, and a test acts while it streams.
TOKEN_MS = 50
LONG = 200  # tokens: longer than any drain here
QUESTION = "Tell me about lighthouses"
# A model of the same engine whose answers stop after STALL_AFTER tokens and never end: an answer
# that nothing but the gateway can end.
STALLED, STALL_AFTER = "acme/stalled", 20


@pytest.fixture(autouse=True)
async def close_executor_connections():
    """The ORM calls made from async code run in asgiref's shared thread; close its
    connection afterwards, or the test database could not be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture(scope="module")
def slow_engine():
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve",
        "acme/local",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        str(TOKEN_MS),
        "--fault",
        f"{STALLED}=stall;after={STALL_AFTER}",
    )
    yield sim
    sim.stop()


@pytest.fixture
def session(alice, slow_engine):
    """A chat session of alice's; every question goes to the slow engine, for LONG tokens unless
    asked."""
    local = endpoint("local", slow_engine, idle_timeout=5, total_timeout=60)
    rule("default", local, is_default=True, use_kb_context=False, max_tokens=LONG)
    return ChatSession.objects.create(user=alice)


@pytest.fixture
def stalled_session(alice, slow_engine):
    """A chat session of alice's whose answers stall: no timeout of the engine's ends them
    within the test."""
    stalled = endpoint("local", slow_engine, model=STALLED, idle_timeout=600, total_timeout=600)
    rule("default", stalled, is_default=True, use_kb_context=False, max_tokens=LONG)
    return ChatSession.objects.create(user=alice)


@pytest.fixture
def cookie(alice) -> str:
    client = Client()
    client.force_login(alice)
    return client.cookies["sessionid"].value


@contextlib.contextmanager
def web(child_env, tmp_path, *, processes: int | None = None, **env):
    """The gateway under daphne, or under config.web with `processes` daphne processes."""
    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "INFO",
        "WEB_WARMUP": "false",
        **env,
    }
    with gateway(env=env, log_path=tmp_path / "web.log", web_concurrency=processes) as server:
        yield server


class Stream:
    """A /v1 stream, read while the test does other things: its events and the tokens among them."""

    def __init__(self, response: aiohttp.ClientResponse):
        self.response, self.events, self.tokens = response, [], []

    async def read(self, *, tokens: int | None = None) -> None:
        """Until `tokens` tokens have come in all, or to the end of the stream."""
        async for raw in self.response.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            self.events.append(data if data == "[DONE]" else json.loads(data))
            choices = self.events[-1].get("choices") if data != "[DONE]" else None
            if choices and "content" in choices[0]["delta"] and "role" not in choices[0]["delta"]:
                self.tokens.append(choices[0]["delta"]["content"])
            if tokens is not None and len(self.tokens) >= tokens:
                return

    @property
    def text(self) -> str:
        return "".join(self.tokens)


async def start_stream(
    http: aiohttp.ClientSession, url: str, key: str, session_id: int, max_tokens: int
) -> Stream:
    """A /v1 stream stored in the session, once its first tokens have come."""
    response = await http.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": str(session_id)},
        json={
            "model": "auto",
            "stream": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": QUESTION}],
        },
    )
    assert response.status == 200, await response.text()
    stream = Stream(response)
    await stream.read(tokens=5)
    return stream


async def socket_frames(socket, frames: list[dict], *, count: int | None = None) -> None:
    """Frames into `frames`: until there are `count`, or to the answer's end."""
    while (
        (len(frames) < count)
        if count is not None
        else not frames or frames[-1]["type"] not in ("done", "error")
    ):
        frames.append(json.loads((await socket.receive(timeout=30)).data))


def sse_events(body: str) -> list[tuple[str, dict]]:
    return [
        (kind.removeprefix("event: "), json.loads(data.removeprefix("data: ")))
        for kind, data in (event.split("\n", 1) for event in body.strip().split("\n\n"))
    ]


async def until_draining(http: aiohttp.ClientSession, url: str, timeout: float = 20) -> None:
    """Until /readyz fails `draining`: the process has taken the signal."""
    started = time.monotonic()
    while True:
        async with http.get(f"{url}/readyz") as probe:
            if probe.status == 503 and (await probe.json())["failing"] == ["draining"]:
                return
        assert time.monotonic() - started < timeout, "the process did not start draining"
        await asyncio.sleep(0.05)


async def wait_exit(process, timeout: float) -> None:
    started = time.monotonic()
    while process.poll() is None:
        assert time.monotonic() - started < timeout, "the process did not exit"
        await asyncio.sleep(0.05)


@sync_to_async
def answers_stored() -> dict[int, Message]:
    return {message.pk: message for message in Message.objects.filter(role="assistant")}


@sync_to_async
def request_logged() -> RequestLog:
    deadline = time.monotonic() + 10
    while not (rows := list(RequestLog.objects.all())) and time.monotonic() < deadline:
        time.sleep(0.05)
    [row] = rows
    return row


async def test_on_sigterm_the_web_processes_take_no_new_chat_and_finish_the_running_stream(
    child_env, tmp_path, alice_key, session, cookie
):
    bearer = {"Authorization": f"Bearer {alice_key}"}
    # A drain far longer than the stream: the processes exit when it is done, not when the drain
    # ends.
    with web(child_env, tmp_path, processes=2, WEB_DRAIN_SECONDS="60") as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            stream = await start_stream(http, server.url, alice_key, session.pk, max_tokens=80)
            server.process.send_signal(
                signal.SIGTERM
            )  # to the launcher, which passes it to both processes
            await asyncio.sleep(0.3)

            async with http.get(f"{server.url}/readyz") as probe:
                assert probe.status == 503
                assert (await probe.json())["failing"] == ["draining"]
            async with http.post(
                f"{server.url}/v1/chat/completions",
                headers=bearer,
                json={"model": "auto", "messages": [{"role": "user", "content": "hello"}]},
            ) as v1:
                assert v1.status == 503 and v1.headers["Retry-After"] == "1"
                error = (await v1.json())["error"]
                assert (error["code"], error["type"]) == ("draining", "api_error")
                assert "shutting down" in error["message"]
            # /v1's other APIs, which store no chat message, are refused alike.
            for path, body in (
                ("/v1/completions", {"model": "auto", "prompt": "hello"}),
                ("/v1/embeddings", {"model": "auto", "input": "hello"}),
            ):
                async with http.post(f"{server.url}{path}", headers=bearer, json=body) as other:
                    assert other.status == 503 and other.headers["Retry-After"] == "1"
                    assert (await other.json())["error"]["code"] == "draining"
            async with http.post(
                f"{server.url}/api/chat/sessions/{session.pk}/messages/stream",
                headers=bearer,
                json={"content": "hello"},
            ) as sse:
                assert sse.status == 503 and sse.headers["Retry-After"] == "1"
                assert (await sse.json())["error"]["code"] == "draining"
            async with http.ws_connect(
                f"{server.url.replace('http', 'ws')}/ws/chat/",
                origin=server.url,
                headers={"Cookie": f"sessionid={cookie}"},
            ) as socket:
                await socket.send_json({"type": "message", "session": None, "content": "hello"})
                frame = json.loads((await socket.receive(timeout=10)).data)
            assert (frame["type"], frame["code"], frame["retry_after"]) == ("error", "draining", 1)

            await stream.read()
            finished = time.monotonic()
        await wait_exit(server.process, timeout=45)
        exited_after = time.monotonic() - finished
        assert server.process.returncode == 0, server.log_path.read_text()
    *_, finish, usage, done = stream.events
    assert done == "[DONE]" and finish["choices"][0]["finish_reason"] == "length"
    # Tokens that arrive together may share a chunk (under load they do): the engine's count is the
    # usage's.
    assert usage["usage"]["completion_tokens"] == 80
    [stored] = (await answers_stored()).values()
    assert (stored.status, stored.content) == ("complete", stream.text)
    # Nothing holds the processes once the stream is done: they do not wait out the drain.
    assert exited_after < 30


async def test_a_stream_still_running_when_the_drain_ends_is_ended_as_shutdown_and_stored_partial(
    child_env, tmp_path, alice_key, session
):
    with web(child_env, tmp_path, WEB_DRAIN_SECONDS="1") as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            stream = await start_stream(http, server.url, alice_key, session.pk, max_tokens=LONG)
            server.process.send_signal(signal.SIGTERM)
            await stream.read()
        await wait_exit(server.process, timeout=20)
        assert server.process.returncode == 0
        log = server.log_path.read_text()
    *_, last, done = stream.events
    assert done == "[DONE]"
    assert (last["error"]["code"], last["error"]["type"]) == ("shutdown", "api_error")
    assert stream.tokens and len(stream.text.split()) < LONG
    [stored] = (await answers_stored()).values()
    assert (stored.status, stored.content) == ("partial", stream.text)
    assert stored.error.startswith("shutdown: ")
    row = await request_logged()
    assert (row.interface, row.status, row.error_code) == ("v1", "partial", "shutdown")
    # Ended by the drain's clock (1 s; later on a loaded machine), not by the stream's own end.
    assert re.search(r"1 turn\(s\) still running after \d+\.\d s: ended as shutdown", log), log


async def test_a_second_signal_ends_the_running_stream_at_once(
    child_env, tmp_path, alice_key, stalled_session
):
    # An answer that cannot end by itself and a drain far longer than the test: only the second
    # signal can end the stream. Both signals are SIGTERM: a parent that ignores SIGINT (a shell's
    # background job, as a fresh clone's `make test` may run) leaves it ignored in daphne, where
    # the drain leaves it alone; and two SIGTERMs that arrive before Python handles the first are
    # one, so the second waits until /readyz says the drain has begun.
    with web(child_env, tmp_path, WEB_DRAIN_SECONDS="600") as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            stream = await start_stream(
                http, server.url, alice_key, stalled_session.pk, max_tokens=LONG
            )
            server.process.send_signal(signal.SIGTERM)
            await until_draining(http, server.url)  # the stream, stalled, goes on meanwhile
            server.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(stream.read(), timeout=30)
        await wait_exit(server.process, timeout=20)
        log = server.log_path.read_text()
    *_, last, done = stream.events
    assert done == "[DONE]" and last.get("error", {}).get("code") == "shutdown", (
        stream.events[-3:],
        log,
    )
    assert 5 <= len(stream.tokens) <= STALL_AFTER
    [stored] = (await answers_stored()).values()
    assert (stored.status, stored.content) == ("partial", stream.text)
    assert stored.error.startswith("shutdown: ")
    assert "SIGTERM during the drain: ending the turns still running now" in log, log


async def test_an_answer_running_when_the_drain_ends_is_ended_as_shutdown_on_every_other_interface(
    child_env, tmp_path, alice_key, session, cookie
):
    bearer = {"Authorization": f"Bearer {alice_key}"}
    with web(child_env, tmp_path, WEB_DRAIN_SECONDS="1") as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            socket = await http.ws_connect(
                f"{server.url.replace('http', 'ws')}/ws/chat/",
                origin=server.url,
                headers={"Cookie": f"sessionid={cookie}"},
            )
            await socket.send_json({"type": "message", "session": None, "content": QUESTION})
            sse = await http.post(
                f"{server.url}/api/chat/sessions/{session.pk}/messages/stream",
                headers=bearer,
                json={"content": QUESTION},
            )
            whole = asyncio.ensure_future(
                http.post(
                    f"{server.url}/v1/chat/completions",
                    headers=bearer,
                    json={"model": "auto", "messages": [{"role": "user", "content": QUESTION}]},
                )
            )
            json_turn = asyncio.ensure_future(
                http.post(
                    f"{server.url}/api/chat/sessions/{session.pk}/messages/",
                    headers=bearer,
                    json={"content": QUESTION},
                )
            )
            frames = []
            await socket_frames(socket, frames, count=5)
            assert frames[-1]["type"] == "token"
            server.process.send_signal(signal.SIGTERM)

            await socket_frames(socket, frames)
            events = sse_events(await sse.text())
            async with await whole as v1:
                assert v1.status == 503 and v1.headers["Retry-After"] == "1"
                assert (await v1.json())["error"]["code"] == "shutdown"
            async with await json_turn as created:
                assert created.status == 201
                answer = (await created.json())["assistant_message"]
            await socket.close()
        await wait_exit(server.process, timeout=20)
    stored = await answers_stored()

    last = frames[-1]
    assert (last["type"], last["code"], last["status"]) == ("error", "shutdown", "partial")
    told = "".join(frame["text"] for frame in frames if frame["type"] == "token")
    assert (stored[last["message_id"]].status, stored[last["message_id"]].content) == (
        "partial",
        told,
    )

    (_, session_event), (kind, last) = events[0], events[-1]
    assert (kind, last["code"], last["partial"]) == ("error", "shutdown", True)
    told = "".join(data["text"] for kind, data in events if kind == "token")
    assert (
        stored[session_event["message_id"]].status,
        stored[session_event["message_id"]].content,
    ) == ("partial", told)

    assert (answer["status"], answer["error"].split(":")[0]) == ("partial", "shutdown")
    assert stored[answer["id"]].content == answer["content"] != ""


async def test_a_joined_answer_ends_as_shutdown_and_a_late_join_gets_it_partial(
    child_env, tmp_path, alice, session, cookie
):
    """The page watching an answer (joined from this process: chat.live) hears the drain's end
    of it; a page that joins after the process is gone gets the stored partial answer."""
    from tests.chat.test_chat_socket import frames_until_end
    from tests.chat.test_live_answers import text_of
    from tests.support.sockets import socket_for

    with web(child_env, tmp_path, WEB_DRAIN_SECONDS="1") as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            asker = await http.ws_connect(
                f"{server.url}/ws/chat/",
                headers={"Cookie": f"sessionid={cookie}", "Origin": server.url},
            )
            await asker.send_json({"type": "message", "session": session.pk, "content": QUESTION})
            asked: list[dict] = []
            await socket_frames(asker, asked, count=4)  # session, route, two tokens
            message_id = asked[0]["message_id"]
            watcher = await socket_for(alice, connect=True)
            await watcher.send_json_to({"type": "join", "message_id": message_id})
            resume = await watcher.receive_json_from(timeout=10)
            assert resume["type"] == "resume" and resume["live"], resume
            server.process.send_signal(signal.SIGTERM)
            watched = [resume, *await frames_until_end(watcher, timeout=30)]
            await watcher.disconnect()
        await wait_exit(server.process, timeout=20)
    assert (watched[-1]["code"], watched[-1]["status"]) == ("shutdown", "partial"), watched[-1]
    stored = (await answers_stored())[message_id]
    assert stored.status == "partial" and text_of(watched) == stored.content

    late = await socket_for(alice, connect=True)
    await late.send_json_to({"type": "join", "message_id": message_id})
    gone = await late.receive_json_from(timeout=10)
    assert (gone["live"], gone["status"], gone["text"]) == (False, "partial", stored.content)
    await late.disconnect()
