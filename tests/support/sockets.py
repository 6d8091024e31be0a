"""The product's sockets for a test: the real ASGI application, logged in by a session cookie
(or anonymous), from the page's own origin unless told otherwise."""

from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application

ORIGIN = "http://testserver"


async def session_key_for(user) -> str:
    """The session key of a fresh login of `user`: what a browser's cookie holds."""
    client = Client()
    await client.aforce_login(user)
    return client.cookies["sessionid"].value


def socket_at(path: str, session_key: str | None = None, origin: str = ORIGIN):
    """A socket on `path` (connect not yet asked), with the session cookie if one is given."""
    headers = [(b"host", b"testserver"), (b"origin", origin.encode())]
    if session_key:
        headers.append((b"cookie", f"sessionid={session_key}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def socket_for(
    user=None, origin: str = ORIGIN, *, path: str = "/ws/chat/", connect: bool = False
) -> WebsocketCommunicator:
    """The socket on `path` (the chat's unless told) of `user`, logged in now, or anonymous."""
    socket = socket_at(path, await session_key_for(user) if user is not None else None, origin)
    if connect:
        assert (await socket.connect(timeout=10))[0]
    return socket
