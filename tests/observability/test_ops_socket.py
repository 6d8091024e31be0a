"""The ops socket is for staff who may view the engines (inference_ops.view_engineprocess): it
shows their status and why they failed. It stays open for hours: each event it would send first
checks that the login which opened it still holds and still has that right. A demoted,
deactivated or logged-out user, or one whose permission was taken away, gets an error frame
instead of the event, and the socket closes with 4403."""

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connections

from core.events import ops_event_abroadcast
from tests.support.personas import staff_user
from tests.support.sockets import session_key_for, socket_at

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"engine": "local", "status": "crashed", "reason": "exit code 137"}
VIEW_ENGINES = "inference_ops.view_engineprocess"
OPS = "/ws/ops/"


@pytest.fixture(autouse=True)
async def close_executor_connections():
    """The ORM calls made from async code run in asgiref's shared thread; close its connection
    afterwards, or the test database could not be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


async def _connect(username: str, *, perms: tuple[str, ...]):
    """A staff user holding `perms`, their socket (connect asked, not yet answered) and session
    key."""
    user = await sync_to_async(staff_user)(username, perms=perms)
    session_key = await session_key_for(user)
    return socket_at(OPS, session_key), user, session_key


async def _hello(socket, username: str) -> None:
    """The socket accepted, and its first frame the hello to `username`."""
    connected, _ = await socket.connect(timeout=10)
    assert connected
    assert await socket.receive_json_from(timeout=10) == {"type": "hello", "user": username}


async def _opened(username: str):
    """The socket of a staff user who may view the engines, past its hello; the user and their
    session key."""
    socket, user, session_key = await _connect(username, perms=(VIEW_ENGINES,))
    await _hello(socket, username)
    return socket, user, session_key


async def _gets_the_event(socket) -> None:
    """An engine event broadcast now reaches the socket as it was sent; then the client leaves."""
    await ops_event_abroadcast(kind="engine.status", data=EVENT)
    assert await socket.receive_json_from(timeout=10) == {
        "type": "event",
        "kind": "engine.status",
        "data": EVENT,
    }
    await socket.disconnect()


async def _refused_with(socket, code: str) -> str:
    frame = await socket.receive_json_from(timeout=10)
    assert frame["type"] == "error" and frame["code"] == code
    assert await socket.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    # The client's side of the close, as a browser answers it: the consumer ends and lets go of the
    # channel layer. Left running, it would hold the layer's receive lock into the next test's loop.
    await socket.disconnect()
    return frame["message"]


async def test_staff_get_engine_events_while_their_login_holds():
    socket, _, _ = await _opened("ops")
    await _gets_the_event(socket)


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
    assert (
        await _refused_with(socket, "logged_out")
        == "You have been logged out; log in again to continue."
    )


async def test_a_deactivated_staff_user_is_refused_at_the_next_ping():
    socket, user, _ = await _opened("ops")
    await get_user_model().objects.filter(pk=user.pk).aupdate(is_active=False)
    await socket.send_json_to({"type": "ping"})
    await _refused_with(socket, "account_inactive")


async def test_a_staff_user_who_may_not_view_the_engines_is_refused_before_accept():
    socket, _, _ = await _connect("bare", perms=())
    connected, code = await socket.connect(timeout=10)
    assert (connected, code) == (False, 4403)
    await socket.disconnect()


async def test_a_superuser_needs_no_permission_of_their_own():
    user = await sync_to_async(get_user_model().objects.create_superuser)(
        "root", password="pw-123456789"
    )
    socket = socket_at(OPS, await session_key_for(user))
    await _hello(socket, "root")
    await _gets_the_event(socket)


async def test_staff_whose_permission_is_taken_away_get_no_more_engine_events():
    socket, user, _ = await _opened("ops")
    await sync_to_async(user.user_permissions.clear)()
    await ops_event_abroadcast(kind="engine.status", data=EVENT)
    message = await _refused_with(socket, "no_permission")
    assert message == "This account may no longer view the engines: the operations feed is closed."


async def test_staff_who_may_view_the_engines_through_a_group_get_engine_events():
    socket, user, _ = await _connect("grouped", perms=())
    await sync_to_async(_grant_through_a_group)(user)
    await _hello(socket, "grouped")
    await _gets_the_event(socket)


def _grant_through_a_group(user):
    from django.contrib.auth.models import Group, Permission

    group = Group.objects.create(name="operators")
    group.permissions.add(
        Permission.objects.get(
            content_type__app_label="inference_ops", codename="view_engineprocess"
        )
    )
    user.groups.add(group)


def test_each_event_asks_about_staff_and_the_permission_in_one_statement():
    """Beside the login's own statement (core.sockets): what was one lookup for is_staff stays
    one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from observability.consumers import _ops_refusal

    viewer, bare = staff_user("viewer", perms=(VIEW_ENGINES,)), staff_user("bare")
    with CaptureQueriesContext(connection) as queries:
        assert _ops_refusal(viewer.pk) is None
    assert len(queries) == 1
    assert _ops_refusal(bare.pk)[0] == "no_permission"
