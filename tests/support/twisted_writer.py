"""Run as a script by tests/test_twisted_tuning.py: a Twisted server (asyncio reactor, as daphne
runs it) with config.twisted_tuning applied writes a known stream in many small writes to a
client that reads slowly through a tiny receive buffer; prints the digest the client got."""

import asyncio
import hashlib
import socket
import sys
import threading
import time

from twisted.internet import asyncioreactor

asyncioreactor.install(asyncio.new_event_loop())

from twisted.internet import protocol, reactor  # noqa: E402

sys.path.insert(0, sys.argv[1])
from config import twisted_tuning  # noqa: E402

twisted_tuning.tune()

PIECES = [(b"%06d:" % i) + bytes([65 + i % 26]) * (i % 300) for i in range(20_000)]


class Writer(protocol.Protocol):
    def connectionMade(self):  # noqa: N802
        for index, piece in enumerate(PIECES):
            if index % 2:
                self.transport.write(piece)
            else:
                self.transport.writeSequence([piece[:3], piece[3:]])
        self.transport.loseConnection()


def client(port: int, result: list):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    time.sleep(0.5)  # let the server's writes outrun the socket buffers
    digest, size = hashlib.sha256(), 0
    while chunk := sock.recv(1024):
        digest.update(chunk)
        size += len(chunk)
        if size < 200_000:
            time.sleep(0.001)
    result.append(digest.hexdigest())
    reactor.callFromThread(reactor.stop)


listening = reactor.listenTCP(0, protocol.Factory.forProtocol(Writer), interface="127.0.0.1")
got: list = []
threading.Thread(target=client, args=(listening.getHost().port, got), daemon=True).start()
reactor.run()
print(got[0], hashlib.sha256(b"".join(PIECES)).hexdigest(), sum(map(len, PIECES)))
