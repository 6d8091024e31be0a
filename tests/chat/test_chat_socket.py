"""The browser chat's WebSocket protocol through the real ASGI application and the Redis channel
layer."""

import asyncio
import json

import aiohttp
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import AsyncClient

from chat.models import ChatSession, Message
from tests.support.factories import endpoint, rule
from tests.support.rate_window import one_rate_window
from tests.support.sockets import socket_at, socket_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def slow_sim():
    """Echoes slowly (50 ms a token), so there is time to press Stop."""
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator("serve", "acme/local", "--mode", "echo", "--inter-token-latency", "50")
    yield sim
    sim.stop()


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


async def slow_default(sim, max_tokens: int = 1000) -> None:
    """Every question to the slow engine `sim`, for up to `max_tokens` tokens."""
    slow = await sync_to_async(endpoint)("slow", sim)
    await sync_to_async(rule)(
        "default", slow, is_default=True, use_kb_context=False, max_tokens=max_tokens
    )


async def frames_until_end(socket, timeout=20):
    frames = []
    while True:
        frame = await socket.receive_json_from(timeout=timeout)
        frames.append(frame)
        if frame["type"] in ("done", "error"):
            return frames


async def running(sim) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{sim.url}/metrics") as response:
            text = await response.text()
    return float(
        next(
            line for line in text.splitlines() if line.startswith("vllm:num_requests_running")
        ).rsplit(" ", 1)[1]
    )


async def test_a_kb_question_gets_session_route_token_done_and_is_stored(alice, product):
    socket = await socket_for(alice)
    assert (await socket.connect())[0]
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    frames = await frames_until_end(socket)
    assert [f["type"] for f in frames] == ["session", "route", "token", "done"]
    session, route, token, done = frames
    assert route["road"] == "kb" and token["text"] == "Use **Forgot password**."
    assert done["status"] == "complete" and done["message_id"] == session["message_id"]
    message = await Message.objects.aget(pk=done["message_id"])
    assert (message.status, message.road, message.content) == (
        "complete",
        "kb",
        "Use **Forgot password**.",
    )
    assert await ChatSession.objects.filter(pk=session["id"], user=alice).aexists()
    await socket.disconnect()


async def test_a_generated_answer_streams_and_continues_the_same_session(alice, product):
    socket = await socket_for(alice)
    await socket.connect()
    await socket.send_json_to(
        {
            "type": "message",
            "session": None,
            "content": "Tell me a long story about the sea and its lighthouses",
        }
    )
    frames = await frames_until_end(socket)
    tokens = [f for f in frames if f["type"] == "token"]
    assert frames[1]["road"] == "local" and tokens and frames[-1]["type"] == "done"
    # Tokens that arrive together go out in one frame (under load they do): what the user reads is
    # the text of the frames, which is the answer stored, and the usage counts the engine's tokens.
    answer = await Message.objects.aget(pk=frames[-1]["message_id"])
    assert "".join(f["text"] for f in tokens) == answer.content != ""
    assert frames[-1]["ttft_ms"] > 0 and frames[-1]["usage"]["completion_tokens"] >= len(tokens)
    session_id = frames[0]["id"]
    await socket.send_json_to(
        {"type": "message", "session": session_id, "content": "And then what happened?"}
    )
    again = await frames_until_end(socket)
    assert again[0]["id"] == session_id
    assert await Message.objects.filter(session_id=session_id).acount() == 4
    await socket.disconnect()


async def test_a_group_rule_routes_a_members_new_and_continued_conversations(alice, bob, product):
    from django.contrib.auth.models import Group

    staff = await Group.objects.acreate(name="staff")
    staff_rule = await sync_to_async(rule)(
        "staff-external", product["external"], priority=10, use_kb_context=False
    )
    await staff_rule.groups.aadd(staff)
    await bob.groups.aadd(staff)
    await asyncio.sleep(1.1)  # the process rereads the rules within a second

    async def targets(user) -> list[str]:
        socket = await socket_for(user)
        assert (await socket.connect())[0]
        seen, session_id = [], None
        # Both turns: the groups come with the turn's own statement, a new session's and a continued
        # one's.
        for question in ("Tell me about lighthouses", "And then what happened?"):
            await socket.send_json_to(
                {"type": "message", "session": session_id, "content": question}
            )
            frames = await frames_until_end(socket)
            assert frames[-1]["type"] == "done", frames[-1]
            session_id = frames[0]["id"]
            seen.append(next(f for f in frames if f["type"] == "route")["target"])
        await socket.disconnect()
        return seen

    assert await targets(bob) == ["external", "external"]
    assert await targets(alice) == ["local", "local"]
    assert (
        await Message.objects.filter(
            session__user=bob, role="assistant", target="external", status="complete"
        ).acount()
        == 2
    )


async def test_stop_cancels_upstream_and_keeps_the_turn_as_cancelled(alice, slow_sim):
    local_sim = slow_sim
    await slow_default(local_sim)
    socket = await socket_for(alice)
    await socket.connect()
    await socket.send_json_to({"type": "message", "session": None, "content": "word " * 600})
    frames = [
        await socket.receive_json_from(timeout=10) for _ in range(4)
    ]  # session, route, 2 tokens
    assert frames[2]["type"] == "token"
    assert await running(local_sim) >= 1
    await socket.send_json_to({"type": "stop"})
    frames = await frames_until_end(socket)
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "cancelled"
    assert frames[-1]["status"] == "cancelled"
    for _ in range(50):
        if await running(local_sim) == 0:
            break
        await asyncio.sleep(0.02)
    assert await running(local_sim) == 0
    message = await Message.objects.aget(pk=frames[-1]["message_id"])
    assert message.status == "cancelled" and message.content  # the partial text is kept
    await socket.disconnect()


async def test_a_dropped_socket_leaves_the_answer_running_and_it_is_stored_whole(alice, slow_sim):
    """A reload or a phone's lost connection must not cost the answer: it goes on, is stored
    whole, and a page that comes back joins it (tests/chat/test_live_answers.py)."""
    await slow_default(slow_sim, max_tokens=20)
    socket = await socket_for(alice)
    await socket.connect()
    await socket.send_json_to({"type": "message", "session": None, "content": "word " * 600})
    session = await socket.receive_json_from(timeout=10)
    await socket.receive_json_from(timeout=10)
    await socket.receive_json_from(timeout=10)
    await socket.disconnect()
    assert await running(slow_sim) == 1
    for _ in range(100):
        message = await Message.objects.aget(pk=session["message_id"])
        if message.status != "streaming":
            break
        await asyncio.sleep(0.05)
    assert message.status == "complete" and message.completion_tokens == 20


async def test_a_socket_dropped_before_the_answer_is_stored_stops_it(alice, slow_sim):
    """Gone before the turn's rows were written: nothing to come back to, so nothing runs on."""
    await slow_default(slow_sim)
    socket = await socket_for(alice)
    await socket.connect()
    await socket.send_json_to({"type": "message", "session": None, "content": "word " * 600})
    await socket.disconnect()
    await asyncio.sleep(0.5)
    assert await running(slow_sim) == 0


async def test_one_answer_at_a_time_per_socket(alice, slow_sim):
    await slow_default(slow_sim)
    socket = await socket_for(alice)
    await socket.connect()
    await socket.send_json_to({"type": "message", "session": None, "content": "word " * 600})
    await socket.receive_json_from(timeout=10)
    await socket.send_json_to({"type": "message", "session": None, "content": "another"})
    while True:
        frame = await socket.receive_json_from(timeout=10)
        if frame["type"] == "error":
            break
    assert frame["code"] == "busy"
    await socket.send_json_to({"type": "stop"})
    await socket.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{nope", "bad_json"),
        ({"type": "dance"}, "unknown_type"),
        ({"type": "message", "session": "abc", "content": "hi"}, "bad_request"),
        ({"type": "message", "session": None, "content": "   "}, "invalid_message"),
        ({"type": "message", "session": None, "content": 42}, "invalid_message"),
        ({"type": "message", "session": None, "content": "x" * 20000}, "message_too_large"),
        (
            {"type": "message", "session": None, "content": "reset my\x00 password"},
            "invalid_message",
        ),
        (
            {"type": "message", "session": None, "content": "reset my \ud800 password"},
            "invalid_message",
        ),
        ({"type": "message", "session": None, "content": "ring \x07 the bell"}, "invalid_message"),
    ],
)
async def test_bad_frames_get_an_error_frame_and_the_socket_stays_open(alice, product, frame, code):
    socket = await socket_for(alice)
    await socket.connect()
    if isinstance(frame, str):
        await socket.send_to(text_data=frame)
    else:
        await socket.send_json_to(frame)
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == code and reply["message"]
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    assert (await frames_until_end(socket))[-1]["type"] == "done"
    # Only the good question was stored, and only it counted against the rate limit.
    assert [m.content async for m in Message.objects.filter(role="user")] == [
        "How do I reset my password?"
    ]
    assert await sync_to_async(_rate_count)(alice) == 1
    await socket.disconnect()


def _rate_count(user) -> int:
    from django.conf import settings

    from core import redis as core_redis

    keys = list(core_redis.client().scan_iter(f"{settings.REDIS_KEY_PREFIX}:chat:rate:{user.pk}:*"))
    return sum(int(core_redis.client().get(key) or 0) for key in keys)


async def test_a_user_cannot_write_into_another_users_session(alice, bob, product):
    session = await ChatSession.objects.acreate(user=alice, title="private")
    socket = await socket_for(bob)
    await socket.connect()
    await socket.send_json_to({"type": "message", "session": session.pk, "content": "hello"})
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "not_found"
    assert not await Message.objects.filter(session=session).aexists()
    await socket.disconnect()


async def test_anonymous_and_foreign_origin_sockets_are_rejected(alice):
    anonymous = await socket_for()
    connected, code = await anonymous.connect()
    assert connected is False and code == 4401
    await (
        anonymous.disconnect()
    )  # lets the rejected application instance finish before the loop closes
    foreign = await socket_for(alice, origin="http://evil.example")
    connected, _ = await foreign.connect()
    assert connected is False
    await foreign.disconnect()


async def _logged_in_socket(user) -> tuple[WebsocketCommunicator, AsyncClient]:
    """A socket and the browser (its session cookie) that opened it."""
    client = AsyncClient()
    await client.aforce_login(user)
    socket = socket_at("/ws/chat/", client.cookies["sessionid"].value)
    connected, _ = await socket.connect()
    assert connected
    return socket, client


async def _deactivate(user):
    user.is_active = False
    await user.asave(update_fields=["is_active"])


async def _change_password(user):
    user.set_password("a-new-password-123456")
    await user.asave(update_fields=["password"])


async def _log_out(client):
    assert (await client.post("/accounts/logout/")).status_code == 302


LOGIN_ENDS = [
    (lambda user, client: _log_out(client), "logged_out"),  # in another tab of the same browser
    (
        lambda user, client: _change_password(user),
        "logged_out",
    ),  # every other session ends, as Django's
    (lambda user, client: _deactivate(user), "account_inactive"),
]


@pytest.mark.parametrize(("end_login", "code"), LOGIN_ENDS)
async def test_a_socket_whose_login_ended_says_so_answers_nothing_and_closes(
    alice, product, end_login, code
):
    socket, client = await _logged_in_socket(alice)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    assert (await frames_until_end(socket))[-1]["type"] == "done"

    await end_login(alice, client)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "What are your opening hours?"}
    )
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == code and "log in" in reply["message"]
    closed = await socket.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4401}
    assert [m.content async for m in Message.objects.filter(role="user")] == [
        "How do I reset my password?"
    ]
    await socket.disconnect()


async def _until_closed(socket) -> tuple[list[dict], int]:
    """The frames a socket gets until it is closed, and the close code."""
    frames = []
    while (output := await socket.receive_output(timeout=10))["type"] == "websocket.send":
        frames.append(json.loads(output["text"]))
    assert output["type"] == "websocket.close", output
    return frames, output["code"]


@pytest.mark.parametrize(("end_login", "code"), LOGIN_ENDS)
async def test_after_the_login_ends_a_join_returns_no_text_and_the_socket_closes(
    alice, product, end_login, code
):
    socket, client = await _logged_in_socket(alice)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    done = (await frames_until_end(socket))[-1]
    join = {"type": "join", "message_id": done["message_id"]}
    await socket.send_json_to(join)
    assert (await socket.receive_json_from(timeout=10))["text"] == "Use **Forgot password**."

    await end_login(alice, client)
    await socket.send_json_to(join)
    frames, closed = await _until_closed(socket)
    assert [(f["type"], f["code"]) for f in frames] == [("error", code)]
    assert "log in" in frames[0]["message"] and "Forgot" not in json.dumps(frames)
    assert closed == 4401
    await socket.disconnect()


@pytest.mark.parametrize(("end_login", "code"), LOGIN_ENDS)
async def test_after_the_login_ends_stop_stops_nothing_and_the_socket_closes(
    alice, slow_sim, end_login, code
):
    """The socket's own answer, stored as started, goes on as it would had the socket closed:
    its Stop is no longer the user's."""
    await slow_default(slow_sim, max_tokens=100)  # five seconds: time to log out and press Stop
    socket, client = await _logged_in_socket(alice)
    await socket.send_json_to({"type": "message", "session": None, "content": "word " * 600})
    session = await socket.receive_json_from(timeout=10)
    assert session["type"] == "session"

    await end_login(alice, client)
    await socket.send_json_to({"type": "stop"})
    frames, closed = await _until_closed(socket)
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == code  # no token after it
    assert all(f["type"] in ("route", "token") for f in frames[:-1]), frames
    assert closed == 4401
    await socket.disconnect()
    message = await _when_stored(session["message_id"])
    assert message.status == "complete" and message.completion_tokens == 100


async def _when_stored(message_id: int) -> Message:
    for _ in range(200):
        message = await Message.objects.aget(pk=message_id)
        if message.status != "streaming":
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"answer {message_id} still streaming")


async def test_a_frame_over_the_size_limit_is_refused_unread_and_the_socket_stays_open(
    alice, product, settings
):
    limit = settings.CHAT_SOCKET_MAX_FRAME_CHARS
    socket = await socket_for(alice, connect=True)
    # The longest question fits, every character escaped: read (and refused for its session).
    longest = {"type": "message", "session": "x", "content": "é" * settings.CHAT_MAX_MESSAGE_CHARS}
    await socket.send_to(text_data=json.dumps(longest))
    assert (await socket.receive_json_from(timeout=10))["code"] == "bad_request"

    frame = json.dumps({"type": "join", "message_id": 1, "padding": "x" * limit})
    await socket.send_to(text_data=frame)
    assert await socket.receive_json_from(timeout=10) == {
        "type": "error",
        "code": "frame_too_large",
        "message": f"A frame may have at most {limit} characters; this one has {len(frame)}.",
    }
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    assert (await frames_until_end(socket))[-1]["type"] == "done"
    await socket.disconnect()


async def test_joins_past_the_limit_get_an_error_frame_and_no_text(alice, product, settings):
    settings.CHAT_JOIN_RATE_LIMIT = 2
    one_rate_window(settings)
    socket = await socket_for(alice, connect=True)
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    done = (await frames_until_end(socket))[-1]
    join = {"type": "join", "message_id": done["message_id"]}
    for _ in range(2):
        await socket.send_json_to(join)
        assert (await socket.receive_json_from(timeout=10))["type"] == "resume"

    await socket.send_json_to(join)
    refused = await socket.receive_json_from(timeout=10)
    assert refused["type"] == "error" and refused["code"] == "rate_limited", refused
    assert refused["message_id"] == done["message_id"] and refused["retry_after"] >= 1
    assert refused["message"].startswith("Too many joins: at most 2 per 86400 s.")
    # Joins are not questions: the user may still ask.
    await socket.send_json_to(
        {"type": "message", "session": None, "content": "How do I reset my password?"}
    )
    assert (await frames_until_end(socket))[-1]["type"] == "done"
    await socket.disconnect()
