"""Request bodies are capped where they arrive, in daphne, before anything authenticates or
buffers them: a live daphne, raw sockets, bodies declared by Content-Length and sent chunked."""

import json
import socket
from urllib.parse import urlsplit

import aiohttp
import pytest
from django.conf import settings

from chat.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # the servers the tests start run with the default


def _connect(asgi_server) -> socket.socket:
    url = urlsplit(asgi_server)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def _read_response(sock) -> tuple[int, dict, bytes]:
    """One response, read until the server closes or its body is complete."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        decoded = b""
        while body:
            size, _, rest = body.partition(b"\r\n")
            decoded, body = decoded + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
        return int(lines[0].split()[1]), headers, decoded
    length = int(headers.get("content-length", 0))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _head(path: str, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


PATHS = ["/v1/chat/completions", "/api/chat/sessions/1/messages/"]


def _assert_refused(status, headers, body, path):
    assert status == 413, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and f"at most {LIMIT} bytes" in error["message"]
    # Each API's documented error shape: OpenAI's on /v1, the gateway's own elsewhere.
    assert set(error) == (
        {"message", "type", "param", "code"}
        if path.startswith("/v1/")
        else {"code", "message", "fields"}
    )


@pytest.mark.parametrize("path", PATHS)
def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(asgi_server, path):
    # No key, no session: the size is refused before anything authenticates. With
    # `Expect: 100-continue` the client has sent only the headers and waits: the 413 comes at once,
    # and no "100 Continue" invites the body.
    with _connect(asgi_server) as sock:
        sock.sendall(_head(path, f"Content-Length: {2 * 1024 * 1024}\r\nExpect: 100-continue\r\n"))
        status, headers, body = _read_response(sock)
    _assert_refused(status, headers, body, path)


@pytest.mark.parametrize("path", PATHS)
def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(asgi_server, path):
    # No Content-Length: the server counts as the chunks arrive and answers while the client is
    # still sending (the body never ends here), instead of buffering whatever comes.
    with _connect(asgi_server) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked\r\n"))
        chunk = b"x" * 65536
        for _ in range(LIMIT // len(chunk) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, headers, body = _read_response(sock)
    _assert_refused(status, headers, body, path)


@pytest.mark.parametrize("path", PATHS)
def test_a_client_that_sends_a_whole_oversized_body_still_reads_the_413(asgi_server, path):
    # A plain client (urllib, requests) writes all of its body before it reads: the server reads
    # and drops the rest, so the connection closes cleanly instead of resetting under the answer.
    with _connect(asgi_server) as sock:
        sock.sendall(
            _head(path, f"Content-Length: {2 * 1024 * 1024}\r\n") + b"x" * (2 * 1024 * 1024)
        )
        status, headers, body = _read_response(sock)
        _assert_refused(status, headers, body, path)
        sock.settimeout(10)
        assert sock.recv(1) == b""  # then the server closes


def test_a_chunked_body_under_the_limit_goes_through(asgi_server):
    with _connect(asgi_server) as sock:
        payload = json.dumps(
            {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        sock.sendall(
            _head("/v1/chat/completions", "Transfer-Encoding: chunked\r\n")
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
        )
        status, _, body = _read_response(sock)
    assert status == 401, body  # past the size check, on to the key check
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


async def test_a_websocket_message_over_the_limit_closes_the_socket(asgi_server, django_user_model):
    from asgiref.sync import sync_to_async
    from django.test import Client

    user = await django_user_model.objects.acreate(username="frank")
    client = Client()
    await client.aforce_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        async with session.ws_connect(
            f"{asgi_server}/ws/chat/",
            headers={"Cookie": cookie, "Origin": asgi_server},
            max_msg_size=0,
        ) as ws:
            # Autobahn drops the connection on a message over daphne's limit (1 MiB by default), and
            # may do so while the client is still writing the frame: a reset during the send is
            # the same refusal seen earlier.
            try:
                await ws.send_str(
                    json.dumps(
                        {"type": "message", "session": None, "content": "x" * (2 * 1024 * 1024)}
                    )
                )
            except (ConnectionError, aiohttp.ClientError):
                pass
            else:
                message = await ws.receive()
                assert message.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.ERROR,
                )
            assert ws.closed or (await ws.receive()).type in (
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            )
    assert not await Message.objects.aexists()
    await sync_to_async(user.delete)()


def test_a_file_upload_may_be_larger_up_to_its_own_limit(asgi_server):
    # The admin's KB import posts a file: multipart/form-data has WEB_MAX_UPLOAD_SIZE.
    boundary = "gw-test-boundary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="kb.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + b"x" * (2 * 1024 * 1024)
    body = part + f"\r\n--{boundary}--\r\n".encode()
    with _connect(asgi_server) as sock:
        sock.sendall(
            (
                "POST /admin/knowledge/entry/import/ HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\nConnection: close\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        status, _, _ = _read_response(sock)
    assert (
        status == 403
    )  # past the size check: refused by Django's CSRF check, as any anonymous form post
    with _connect(asgi_server) as sock:
        sock.sendall(
            f"POST /admin/knowledge/entry/import/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {settings.WEB_MAX_UPLOAD_SIZE + 1}\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        status, _, body = _read_response(sock)
    assert (
        status == 413
        and f"at most {settings.WEB_MAX_UPLOAD_SIZE} bytes" in json.loads(body)["error"]["message"]
    )
