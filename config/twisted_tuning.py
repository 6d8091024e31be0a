"""Three changes to how Twisted (daphne's server) spends CPU per request and per write.

Daphne runs the ASGI application on Twisted. Profiled under concurrent streams (py-spy and
cProfile on the live process), two of Twisted's habits cost more than parts of the relay:

1. Each POST's Content-Type is parsed with the email package, to decode HTML forms into
   `request.args`, which daphne never reads (it hands the raw body to the application): a
   tenth of the process's CPU at 64 streams. The parse is a pure function, bytes to bytes,
   so its few distinct answers are remembered.
2. A write never goes to the socket at once: Twisted buffers it, registers the socket for
   writability (an epoll change), sends on the next loop turn and unregisters (another). A
   streamed answer writes once per token, so that is two extra system calls and a loop turn
   per token and stream. Here a write to a plain TCP connection with nothing buffered goes
   straight to `send`; only what the socket does not take now is buffered, Twisted's way, and
   anything unusual (TLS, a closing connection, a paused producer, data already waiting)
   takes Twisted's own path. asyncio's transports write the same way. Measured: about a fifth
   less gateway CPU per 128-token streamed answer (docs/benchmarks.md#fig-per-token).
3. `twisted.web.http` is a module behind Twisted's deprecation proxy, and daphne writes each
   body chunk with `http.Request.write(...)`: every chunk of every stream looked `Request` up
   through the proxy's Python `__getattribute__`, visible in a profile at 64 streams. Daphne's
   module now holds the module itself; the names it uses are not deprecated.

`tune()` is idempotent; config.asgi calls it, so every daphne process has it.
"""

from __future__ import annotations

import functools

_tuned = False


def tune() -> None:
    global _tuned
    if _tuned:
        return
    from twisted.internet import tcp
    from twisted.web import http

    http._parseContentType = functools.lru_cache(maxsize=64)(http._parseContentType)

    from daphne import http_protocol

    http_protocol.http = _unproxied(http_protocol.http)

    buffered_write, buffered_write_sequence = tcp.Connection.write, tcp.Connection.writeSequence

    def write(self, data):
        rest = _send_now(self, data)
        if rest:
            buffered_write(self, rest)

    def writeSequence(self, iovec):  # noqa: N802 - Twisted's name
        if not _idle(self):
            buffered_write_sequence(self, iovec)
            return
        rest = _send_now(self, b"".join(iovec))
        if rest:
            buffered_write(self, rest)

    tcp.Connection.write, tcp.Connection.writeSequence = write, writeSequence  # type: ignore[method-assign]  # the tuning replaces them
    _tuned = True


def _unproxied(module):
    """The module behind a Twisted deprecation proxy (the module itself if it has none)."""
    from twisted.python.deprecate import _ModuleProxy

    if isinstance(module, _ModuleProxy):
        return object.__getattribute__(module, "_module")
    return module


def _idle(connection) -> bool:
    """A plain, open connection with nothing buffered or pending: a write may go out directly."""
    return (
        not connection.TLS
        and connection.connected
        and not connection.disconnecting
        and not connection._writeDisconnected
        and not connection.producerPaused
        and not connection.dataBuffer
        and not connection._tempDataBuffer
    )


def _send_now(connection, data: bytes) -> bytes:
    """Send what the socket takes now; return what is left for Twisted's buffer: all of it when
    the connection is not idle or the send failed (Twisted's own path then finds out why)."""
    if not data or not _idle(connection):
        return data
    sent = connection.writeSomeData(data)
    if not isinstance(sent, int) or sent <= 0:
        return data
    return data[sent:]
