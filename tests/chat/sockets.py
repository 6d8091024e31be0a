"""The browser chat's socket for a test: the real ASGI application, logged in as `user` by its
session cookie (or anonymous), from the page's own origin unless told otherwise."""

from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application


async def socket_for(
    user=None, origin="http://testserver", *, connect: bool = False
) -> WebsocketCommunicator:
    headers = [(b"host", b"testserver"), (b"origin", origin.encode())]
    if user is not None:
        client = Client()
        await client.aforce_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    socket = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    if connect:
        assert (await socket.connect())[0]
    return socket
