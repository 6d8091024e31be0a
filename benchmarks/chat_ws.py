"""The browser chat's load: N WebSockets to /ws/chat/, each logged in, each asking in turn.

What the page does, socket by socket: open the socket with the session cookie, send
{"type": "message", "session": …, "content": …}, read `session`, `route`, `token`… frames
up to `done` or `error`, then ask the next question in the same chat session. All sockets
are open before the first question, and all first questions leave together.

No Django here: `manage.py bench_chat` makes the users, their cookies and the servers, and
calls `run_level`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

CONNECT_TIMEOUT = 15.0  # seconds for the TCP connection and the WebSocket handshake


@dataclass
class Answer:
    """One question's answer as the socket saw it. Times are seconds from sending its frame."""

    socket: int
    index: int
    ttft: float | None = None  # to the first `token` frame
    end: float | None = None  # to `done`
    frames: int = 0  # `token` frames received
    tokens: int | None = None  # completion tokens, from `done`'s usage
    road: str | None = None
    error: str | None = None  # "error:rate_limited", "timeout", "closed", ...
    asked: str = ""  # the question's text
    parts: list[str] = field(default_factory=list)  # the `token` frames' texts, in order
    session: int | None = None  # the chat session the answer went into

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None


@dataclass
class Level:
    sockets: int
    makespan: float  # from the first question sent to the last answer ended
    answers: list[Answer] = field(default_factory=list)
    connect_errors: Counter = field(default_factory=Counter)

    @property
    def completed(self) -> list[Answer]:
        return [answer for answer in self.answers if answer.ok]

    @property
    def errors(self) -> Counter:
        return (
            Counter(answer.error for answer in self.answers if answer.error) + self.connect_errors
        )


def ws_url(base_url: str) -> str:
    return (
        base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1).rstrip("/")
        + "/ws/chat/"
    )


async def _ask(
    ws: aiohttp.ClientWebSocketResponse,
    answer: Answer,
    *,
    session_id: int | None,
    content: str,
    timeout: float,
) -> int | None:
    """Send one question and read its frames to the end; returns the chat session's id."""
    began = time.perf_counter()
    deadline = began + timeout
    answer.asked = content
    await ws.send_str(json.dumps({"type": "message", "session": session_id, "content": content}))
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            answer.error = "timeout"
            return session_id
        try:
            message = await ws.receive(timeout=remaining)
        except TimeoutError:
            answer.error = "timeout"
            return session_id
        if message.type != aiohttp.WSMsgType.TEXT:
            answer.error = (
                f"closed ({ws.close_code})"
                if message.type
                in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)
                else str(message.type)
            )
            return session_id
        frame = json.loads(message.data)
        kind = frame.get("type")
        if kind == "token":
            answer.frames += 1
            answer.parts.append(frame["text"])
            if answer.ttft is None:
                answer.ttft = time.perf_counter() - began
        elif kind == "session":
            session_id = answer.session = frame["id"]
        elif kind == "done":
            answer.session = session_id
            answer.end = time.perf_counter() - began
            answer.road = frame.get("road")
            answer.tokens = (frame.get("usage") or {}).get("completion_tokens")
            return session_id
        elif kind == "error":
            answer.error = f"error:{frame.get('code')}"
            return session_id


async def _socket(
    index: int,
    *,
    http: aiohttp.ClientSession,
    url: str,
    origin: str,
    cookie: str,
    answers: int,
    question: Callable[[int, int], str],
    timeout: float,
    opened: asyncio.Barrier,
    level: Level,
    until: Callable[[], float] | None = None,
) -> None:
    """Ask `answers` questions in turn, or, with `until`, ask until the time it returns has passed
    (read before each question: the clock starts when every socket is open)."""
    ws = None
    try:
        try:
            ws = await asyncio.wait_for(
                http.ws_connect(
                    url, headers={"Cookie": cookie, "Origin": origin}, autoping=True, heartbeat=None
                ),
                CONNECT_TIMEOUT,
            )
        except aiohttp.WSServerHandshakeError as exc:
            # Channels refuses an unauthenticated socket before accepting it: a 403 handshake.
            level.connect_errors[f"handshake {exc.status}"] += 1
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            level.connect_errors[f"connect: {type(exc).__name__}"] += 1
        await opened.wait()  # every socket, open or not, so the others are not left waiting
        if ws is None:
            return
        session_id = None
        for number in range(answers) if until is None else itertools.count():
            if until is not None and time.perf_counter() >= until():
                return
            answer = Answer(socket=index, index=number)
            level.answers.append(answer)
            session_id = await _ask(
                ws, answer, session_id=session_id, content=question(index, number), timeout=timeout
            )
            if answer.error == "timeout" or ws.closed:
                # A timed-out answer may still be streaming: the next question would only be
                # refused.
                return
    finally:
        if ws is not None:
            await ws.close()


async def run_level(
    *,
    base_url: str,
    cookies: list[str],
    answers: int,
    question: Callable[[int, int], str],
    timeout: float,
    seconds: float | None = None,
) -> Level:
    """One socket per cookie, each asking `answers` questions one after another; with `seconds`,
    each asking until that many seconds have passed since all were open (the soak).

    `question(socket, number)` gives each question's text; `timeout` bounds each answer, so
    the level is bounded by `answers * timeout` (or `seconds + timeout`) plus the connections'.
    """
    level = Level(sockets=len(cookies), makespan=0.0)
    opened = asyncio.Barrier(len(cookies) + 1)
    start: list[float] = []
    until = (lambda: start[0] + seconds) if seconds is not None else None
    # No client-side connection cap: every socket its own TCP connection, as browsers are.
    connector = aiohttp.TCPConnector(limit=0)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as http:
        origin = base_url.rstrip("/")
        tasks = [
            asyncio.create_task(
                _socket(
                    i,
                    http=http,
                    url=ws_url(base_url),
                    origin=origin,
                    cookie=cookie,
                    answers=answers,
                    question=question,
                    timeout=timeout,
                    opened=opened,
                    level=level,
                    until=until,
                )
            )
            for i, cookie in enumerate(cookies)
        ]
        try:
            start.append(time.perf_counter())
            await asyncio.wait_for(opened.wait(), CONNECT_TIMEOUT + 5)
            began = start[0] = time.perf_counter()
            # Each answer is bounded already; this only guards against a bug in the bounds.
            bound = answers * timeout if seconds is None else seconds + timeout
            await asyncio.wait_for(asyncio.gather(*tasks), bound + 10)
            level.makespan = time.perf_counter() - began
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return level
