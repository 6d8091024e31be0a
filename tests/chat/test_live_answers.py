"""Answers that survive their socket: a reload, a second tab or a phone back online joins the
answer the server is still writing, gets the text so far and then the live tokens, each exactly
once, and its Stop stops it; in the same web process or in another one (chat.live)."""

import asyncio

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import Client

from chat import live
from chat.models import Message
from tests.chat.test_chat_socket import frames_until_end, running
from tests.support.factories import endpoint, rule
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "word " * 600
ANSWER_TOKENS = 60  # at 50 ms a token: three seconds to reload, join and stop in


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def slow_sim():
    """Echoes slowly (50 ms a token)."""
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator("serve", "acme/local", "--mode", "echo", "--inter-token-latency", "50")
    yield sim
    sim.stop()


@pytest.fixture
def slow_rule(slow_sim):
    slow = endpoint("slow", slow_sim)
    rule("default", slow, is_default=True, use_kb_context=False, max_tokens=ANSWER_TOKENS)
    return slow_sim


async def ask(socket) -> tuple[dict, str]:
    """Ask the long question; returns the session frame and the text of the first tokens."""
    await socket.send_json_to({"type": "message", "session": None, "content": LONG})
    session = await socket.receive_json_from(timeout=10)
    assert session["type"] == "session"
    text = ""
    while text.count("word") < 3:
        frame = await socket.receive_json_from(timeout=10)
        if frame["type"] == "token":
            text += frame["text"]
    return session, text


async def ask_under_daphne(http: aiohttp.ClientSession, url: str, user):
    """A socket of `user`'s on the daphne process at `url` that asked the long question; returns
    it and the session frame, once the first token has come."""
    client = Client()
    await sync_to_async(client.force_login)(user)
    socket = await http.ws_connect(
        f"{url}/ws/chat/",
        headers={"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": url},
    )
    await socket.send_json({"type": "message", "session": None, "content": LONG})
    session = await asyncio.wait_for(socket.receive_json(), 10)
    while (await asyncio.wait_for(socket.receive_json(), 10))["type"] != "token":
        pass
    return socket, session


def text_of(frames: list[dict]) -> str:
    resume = frames[0]
    assert resume["type"] == "resume" and resume["live"] is True, resume
    return resume["text"] + "".join(f["text"] for f in frames if f["type"] == "token")


async def stored(message_id: int) -> Message:
    for _ in range(100):
        message = await Message.objects.aget(pk=message_id)
        if message.status != "streaming":
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"answer {message_id} still streaming")


async def test_a_reload_mid_answer_gets_every_token_exactly_once_and_the_answer_goes_on(
    alice, slow_rule
):
    first = await socket_for(alice, connect=True)
    session, seen = await ask(first)
    await first.disconnect()  # the page reloads: its socket is gone, the answer is not

    again = await socket_for(alice, connect=True)
    await again.send_json_to({"type": "join", "message_id": session["message_id"]})
    frames = await frames_until_end(again)
    resume = frames[0]
    assert resume["road"] == "local" and resume["status"] == "streaming"
    assert resume["text"].startswith(seen)  # what the first page saw, and what came meanwhile
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "complete"
    message = await stored(session["message_id"])
    assert message.status == "complete"
    assert text_of(frames) == message.content  # nothing lost, nothing twice
    assert message.completion_tokens == ANSWER_TOKENS
    await again.disconnect()


async def test_a_second_tab_sees_the_same_answer_and_its_stop_ends_it_for_both(alice, slow_rule):
    asking = await socket_for(alice, connect=True)
    session, _ = await ask(asking)
    watching = await socket_for(alice, connect=True)
    await watching.send_json_to({"type": "join", "message_id": session["message_id"]})
    resume = await watching.receive_json_from(timeout=10)
    assert resume["type"] == "resume" and resume["live"]
    token = await watching.receive_json_from(timeout=10)
    assert token["type"] == "token"
    await watching.send_json_to({"type": "stop"})

    watched = [resume, token, *await frames_until_end(watching)]
    asked = await frames_until_end(asking)
    for frames in (watched, asked):
        assert frames[-1]["code"] == "cancelled" and frames[-1]["status"] == "cancelled"
    message = await stored(session["message_id"])
    assert message.status == "cancelled"
    assert text_of(watched) == message.content
    for _ in range(50):
        if await running(slow_rule) == 0:
            break
        await asyncio.sleep(0.02)
    assert await running(slow_rule) == 0  # stopped upstream too
    await asking.disconnect()
    await watching.disconnect()


async def test_a_join_of_an_answer_that_ended_or_is_not_yours_gets_the_stored_one_or_an_error(
    alice, bob, product
):
    socket = await socket_for(alice, connect=True)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    done = (await frames_until_end(socket))[-1]
    await socket.send_json_to({"type": "join", "message_id": done["message_id"]})
    resume = await socket.receive_json_from(timeout=10)
    assert resume == {
        "type": "resume",
        "message_id": done["message_id"],
        "live": False,
        "status": "complete",
        "text": "Use **Forgot password**.",
        "road": "kb",
        "target": "KB#" + str(product["entry"].pk),
        "why": None,
    }
    await socket.send_json_to({"type": "join", "message_id": "7"})
    assert (await socket.receive_json_from(timeout=10))["code"] == "bad_request"
    await socket.disconnect()

    other = await socket_for(bob, connect=True)
    await other.send_json_to({"type": "join", "message_id": done["message_id"]})
    refused = await other.receive_json_from(timeout=10)
    assert refused["type"] == "error" and refused["code"] == "not_found"
    await other.disconnect()


async def test_an_answer_run_by_another_web_process_is_joined_there_and_stopped_from_here(
    asgi_server, alice, slow_rule
):
    """The answer runs in the daphne process; the page that joins it is on this one (the test's
    own ASGI application): frames and Stop go through the processes' relays."""
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        elsewhere, session = await ask_under_daphne(http, asgi_server, alice)
        here = await socket_for(alice, connect=True)
        await here.send_json_to({"type": "join", "message_id": session["message_id"]})
        resume = await here.receive_json_from(timeout=10)
        assert resume["type"] == "resume" and resume["live"], resume
        frames = [resume]
        while sum(f["type"] == "token" for f in frames) < 3:
            frames.append(await here.receive_json_from(timeout=10))
        await here.send_json_to({"type": "stop"})
        frames += await frames_until_end(here)
        assert frames[-1]["code"] == "cancelled", frames[-1]
        message = await stored(session["message_id"])
        assert message.status == "cancelled"
        assert text_of(frames) == message.content
        await here.disconnect()
        await elsewhere.close()
    finally:
        await http.close()


async def test_a_joined_answer_of_another_process_leaves_no_watcher_here_when_it_ends(
    asgi_server, alice, slow_rule
):
    """The joining process forgets the watch with the answer's last frame: a socket that watched
    an answer to its end has nothing to leave, and nothing of it stays behind."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        elsewhere, session = await ask_under_daphne(http, asgi_server, alice)
        here = await socket_for(alice, connect=True)
        await here.send_json_to({"type": "join", "message_id": session["message_id"]})
        frames = await frames_until_end(here)
        assert frames[0]["type"] == "resume" and frames[0]["live"], frames[0]
        assert frames[-1]["type"] == "done", frames[-1]
        assert live.relay().watching == {}
        await here.disconnect()
        await elsewhere.close()


async def test_under_daphne_a_closed_socket_leaves_its_answer_running_to_the_end(
    asgi_server, alice, slow_rule
):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        socket, session = await ask_under_daphne(http, asgi_server, alice)
        await socket.close()
    message = await stored(session["message_id"])
    assert message.status == "complete", (message.status, message.error)
    assert message.completion_tokens == ANSWER_TOKENS
