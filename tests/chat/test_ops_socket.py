"""The ops socket stays open for hours: each event it would send first checks that the login
which opened it still holds and is still staff's. A demoted, deactivated or logged-out user
gets an error frame instead of the event, and the socket closes with 4403."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connections
from django.test import Client

from config.asgi import application
from core.events import ops_event_abroadcast

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"engine": "local", "status": "crashed", "reason": "exit code 137"}


@pytest.fixture(autouse=True)
async def close_executor_connections():
    """The ORM calls made from async code run in asgiref's shared thread; close its connection
    afterwards, or the test database could not be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


async def _opened(username: str):
    """A staff user's socket, past its hello; the user and their session key."""
    user = await sync_to_async(get_user_model().objects.create_user)(username, password="pw-123456789",
                                                                      is_staff=True)
    client = Client()
    await client.aforce_login(user)
    session_key = client.cookies["sessionid"].value
    socket = WebsocketCommunicator(application, "/ws/ops/", headers=[
        (b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", f"sessionid={session_key}".encode())])
    connected, _ = await socket.connect(timeout=10)
    assert connected
    assert await socket.receive_json_from(timeout=10) == {"type": "hello", "user": username}
    return socket, user, session_key


async def _refused_with(socket, code: str) -> str:
    frame = await socket.receive_json_from(timeout=10)
    assert frame["type"] == "error" and frame["code"] == code
    assert await socket.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    return frame["message"]


async def test_staff_get_engine_events_while_their_login_holds():
    socket, _, _ = await _opened("ops")
    await ops_event_abroadcast(kind="engine.status", data=EVENT)
    assert await socket.receive_json_from(timeout=10) == {"type": "event", "kind": "engine.status", "data": EVENT}
    await socket.disconnect()


async def test_a_demoted_staff_user_gets_no_more_engine_events():
    socket, user, _ = await _opened("ops")
    await get_user_model().objects.filter(pk=user.pk).aupdate(is_staff=False)
    await ops_event_abroadcast(kind="engine.status", data=EVENT)
    message = await _refused_with(socket, "not_staff")
    assert message == "This account is no longer staff: the operations feed is closed."


async def test_a_logged_out_staff_user_gets_no_more_engine_events():
    socket, _, session_key = await _opened("ops")
    await Session.objects.filter(session_key=session_key).adelete()  # what a logout elsewhere does
    await ops_event_abroadcast(kind="engine.status", data=EVENT)
    assert await _refused_with(socket, "logged_out") == "You have been logged out; log in again to continue."


async def test_a_deactivated_staff_user_is_refused_at_the_next_ping():
    socket, user, _ = await _opened("ops")
    await get_user_model().objects.filter(pk=user.pk).aupdate(is_active=False)
    await socket.send_json_to({"type": "ping"})
    await _refused_with(socket, "account_inactive")
