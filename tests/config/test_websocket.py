import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.contrib.auth import get_user_model
from django.db import connections

from core.events import ops_event_abroadcast
from tests.support.personas import staff_user
from tests.support.sockets import ORIGIN, session_key_for, socket_at

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def close_executor_connections():
    """The ORM calls made from async code run in asgiref's shared thread; close its
    connection afterwards, or the test database could not be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


async def _new_user_session(**fields) -> str:
    user = await sync_to_async(get_user_model().objects.create_user)(
        password="pw-123456789", **fields
    )
    return await session_key_for(user)


async def _operator_session(username: str = "ops") -> str:
    """Staff who may view the engines: whom the operations feed is for."""
    return await session_key_for(
        await sync_to_async(staff_user)(username, perms=("inference_ops.view_engineprocess",))
    )


def _socket(session_key: str | None = None, origin: str = ORIGIN):
    return socket_at("/ws/ops/", session_key, origin)


def test_the_channel_layer_is_redis():
    assert isinstance(get_channel_layer(), RedisChannelLayer)


async def test_staff_gets_ops_events_broadcast_through_redis():
    socket = _socket(await _operator_session())
    connected, _ = await socket.connect()
    assert connected
    assert await socket.receive_json_from(timeout=5) == {"type": "hello", "user": "ops"}

    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from(timeout=5) == {"type": "pong"}

    await ops_event_abroadcast(kind="engine.status", data={"engine": "local", "status": "ready"})
    assert await socket.receive_json_from(timeout=5) == {
        "type": "event",
        "kind": "engine.status",
        "data": {"engine": "local", "status": "ready"},
    }
    await socket.disconnect()


async def test_a_malformed_frame_gets_an_error_not_a_dropped_socket():
    socket = _socket(await _operator_session())
    await socket.connect()
    await socket.receive_json_from(timeout=5)
    await socket.send_to(text_data="{not json")
    frame = await socket.receive_json_from(timeout=5)
    assert frame["type"] == "error" and frame["code"] == "bad_json"
    await socket.send_json_to({"type": "ping"})
    assert await socket.receive_json_from(timeout=5) == {"type": "pong"}
    await socket.disconnect()


async def test_anonymous_sockets_are_rejected_before_accept():
    socket = _socket()
    connected, code = await socket.connect()
    assert connected is False
    assert code == 4403
    await socket.disconnect()


async def test_non_staff_users_are_rejected_before_accept():
    socket = _socket(await _new_user_session(username="user"))
    connected, code = await socket.connect()
    assert connected is False
    assert code == 4403
    await socket.disconnect()


async def test_staff_without_the_engines_view_permission_are_rejected_before_accept():
    socket = _socket(await _new_user_session(username="bare", is_staff=True))
    connected, code = await socket.connect()
    assert connected is False
    assert code == 4403
    await socket.disconnect()


async def test_foreign_origins_are_rejected():
    socket = _socket(await _operator_session(), origin="http://evil.example")
    connected, _ = await socket.connect()
    assert connected is False
    await socket.disconnect()
