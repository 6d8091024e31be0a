"""A TCP proxy for fault tests: `python tests/support/tcp_proxy.py LISTEN_PORT TARGET`, where
TARGET is HOST:PORT or the path of a unix socket. Killing it cuts every connection through it at
once and refuses new ones, as a database that went away; starting it again on the same port
restores it."""

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def main(listen_port: int, target: str) -> None:
    async def connect():
        if target.startswith("/"):
            return await asyncio.open_unix_connection(target)
        host, _, port = target.rpartition(":")
        return await asyncio.open_connection(host, int(port))

    async def handle(client_reader, client_writer):
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(connect(), 5)
        except (TimeoutError, OSError):
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, reuse_address=True)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
