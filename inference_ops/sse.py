"""Server-sent events read from a byte stream, however the network splits it."""


class SSEDecoder:
    """Server-sent events from arbitrary byte reads: `feed` returns the data of each event that
    the bytes so far complete, keeping a partial event for the next read."""

    def __init__(self):
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._rest + data
        if b"\r" in buffer:  # CRLF line ends; a CR split from its LF is completed by the next read
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, self._rest = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            lines = [
                line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
            ]
            if lines:
                payloads.append(lines[0] if len(lines) == 1 else b"\n".join(lines))
        return payloads
