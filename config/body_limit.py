"""Request bodies are capped where they arrive: in daphne's Twisted request, before they are kept.

Twisted reads a whole request body (to memory, or past 100 kB to a temporary file) before daphne
sees the request, and daphne then queues all of it, chunk by chunk, for the application at once:
a limit checked by the application (Django's DATA_UPLOAD_MAX_MEMORY_SIZE, the /v1 API's own) comes
after the memory and the disk are spent, and for Django after authentication. So the limit is
kept here, for every path, both ASGI applications and any caller, signed in or not:

- a Content-Length over the limit is answered 413 as soon as the headers are in, without the
  "100 Continue" that a client sending `Expect: 100-continue` waits for before its body;
- a body without one (chunked) is counted as it arrives and answered 413 once it passes the limit.

Either way nothing more of the body is kept. Its rest is read and dropped, for a few seconds at
most, so that the client, which usually writes its whole body before it reads, sees the 413
instead of a connection reset; then the connection closes. The error has each API's documented
shape: OpenAI's under /v1/, the gateway's `{"error": {"code", "message", "fields"}}` elsewhere.

The limit is DATA_UPLOAD_MAX_MEMORY_SIZE, except for multipart/form-data (file uploads: the admin's
KB import), which may be up to WEB_MAX_UPLOAD_SIZE. A request within it costs one comparison,
and one addition and comparison per chunk of body Twisted reads.

`install()` is idempotent; config.asgi calls it, so every daphne process has it.
"""

from __future__ import annotations

import json

from django.conf import settings

from core.errors import error_body, openai_error_body

# How long the rest of a refused body is read (and dropped) before the connection is cut.
LINGER_SECONDS = 5.0

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from daphne import http_protocol

    # HTTPFactory.buildProtocol looks the name up when each connection arrives.
    http_protocol.WebRequest = _capped(http_protocol.WebRequest)
    _installed = True


def _limit_for(request, limit: int, upload_limit: int) -> int:
    content_type = request.requestHeaders.getRawHeaders(b"content-type") or [b""]
    return upload_limit if content_type[0].lower().startswith(b"multipart/form-data") else limit


def error_response(path: bytes, limit: int) -> bytes:
    """The whole 413 response, status line to body, in the API's shape for `path`."""
    message = f"The request body is too large: at most {limit} bytes."
    shaped = (
        openai_error_body(413, message, code="request_too_large")
        if path.startswith(b"/v1/")
        else error_body("request_too_large", message)
    )
    body = json.dumps(shaped).encode()
    head = (
        "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _capped(web_request: type) -> type:
    if getattr(web_request, "body_capped", False):
        return web_request
    # Read once: the settings of a process do not change while it serves.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    upload_limit = max(settings.WEB_MAX_UPLOAD_SIZE, limit)

    class CappedWebRequest(web_request):
        body_capped = True
        _received = 0
        _refused = False
        _linger = None

        def gotLength(self, length):  # noqa: N802 - Twisted's names
            # The headers are in, the body is not: the earliest moment a size is known.
            if (
                length is not None
                and length > limit
                and length > _limit_for(self, limit, upload_limit)
            ):
                self.content = _Dropped()
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data):  # noqa: N802
            if self._refused:
                return
            self._received += len(data)
            if self._received > limit and self._received > _limit_for(self, limit, upload_limit):
                self.content.close()  # what was kept of it goes now
                self.content = _Dropped()
                self._refuse()
                return
            self.content.write(data)

        def requestReceived(self, command, path, version):  # noqa: N802
            if self._refused:
                # The refused body has been read to its end: close, the answer is out.
                self.channel.transport.loseConnection()
                return
            super().requestReceived(command, path, version)

        def connectionLost(self, reason):  # noqa: N802
            if self._linger is not None and self._linger.active():
                self._linger.cancel()
            super().connectionLost(reason)

        def _refuse(self):
            from twisted.internet import reactor

            self._refused = True
            channel = self.channel
            # Twisted sends "100 Continue" after this method when the client asked for it: that
            # would invite the body just refused.
            self.requestHeaders.removeHeader(b"expect")
            channel.transport.write(
                error_response(
                    getattr(channel, "_path", b""), _limit_for(self, limit, upload_limit)
                )
            )
            self._linger = reactor.callLater(LINGER_SECONDS, channel.transport.abortConnection)  # type: ignore[arg-type]  # Twisted's interfaces omit self

    CappedWebRequest.__name__ = CappedWebRequest.__qualname__ = f"Capped{web_request.__name__}"
    return CappedWebRequest


class _Dropped:
    """The content file of a refused request: takes nothing, holds nothing."""

    closed = True

    def write(self, data):
        pass

    def read(self, size=-1):
        return b""

    def seek(self, *args):
        return 0

    def close(self):
        pass
