"""A bare streaming relay, the floor a Python gateway can reach on this machine.

    python -m benchmarks.relay --upstream http://127.0.0.1:8001 [--port 8002]

One aiohttp process that passes `POST /v1/chat/completions` to the upstream engine and its
response back, bytes as they arrive: no parsing, no authentication, no database, nothing stored.
Point `manage.py bench --compare` at it and at the gateway in turn: what the relay loses against
the engine directly is the cost of a Python hop itself (two sockets per stream, one event loop)
on this machine, and what the gateway loses beyond it is the gateway's own.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def relay_app(upstream: str, *, timeout: float = 300.0) -> web.Application:
    """The relay as an aiohttp application forwarding to `upstream` (without /v1)."""
    app = web.Application()

    async def session_start(app: web.Application):
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=5),
        )
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.read()
        async with request.app["session"].post(
            upstream + request.path, data=body, headers=headers
        ) as upstream_reply:
            reply = web.StreamResponse(
                status=upstream_reply.status,
                headers={
                    k: v for k, v in upstream_reply.headers.items() if k.lower() not in _HOP_HEADERS
                },
            )
            await reply.prepare(request)
            async for data in upstream_reply.content.iter_any():
                await reply.write(data)
            await reply.write_eof()
            return reply

    app.cleanup_ctx.append(session_start)
    app.router.add_post("/v1/chat/completions", forward)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the engine's base URL, without /v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    args = parser.parse_args(argv)
    web.run_app(
        relay_app(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
