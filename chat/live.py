"""Answers that outlive their socket: a running answer any of its user's sockets can join.

A page that reloads, a second tab, a phone back online: each opens a new socket, finds the
answer the server is still writing (its row says `streaming`) and sends `{"type": "join",
"message_id": N}`. It gets one `resume` frame with the text so far, then the live frames, each
token exactly once, and its Stop stops the answer.

Where the answer runs. The turn runs in the web process whose socket asked (chat.consumers), and
goes on when that socket closes: an answer is stored whole whether or not anyone watches it. Each
process keeps its own running answers here (`LiveAnswer`, by message id). A join that lands on the
same process subscribes in memory; one that lands on another process asks every web process at
once over Redis pub/sub (one message on the shared channel; each process's `Relay` also listens on
a channel of its own) and the process that runs the answer replies to the joiner's process, then
forwards the answer's frames to it, in order, on that channel.

What it costs. Nothing is written anywhere per answer or per token for this: the answer's text is
the list the turn keeps anyway (chat.turns.run_turn's `parts`), and the socket that asked pays one
counter and one empty-set check per token. A join costs one statement (the row is the user's and
still streaming), a snapshot of the text, and, across processes, one published message and a
reply. Frames for a watcher queue in memory and go in order, one send at a time, tokens that
queue up merged into one frame: a slow watcher costs the answer's length at most, never the
answer's pace. A process listens from its first answer (or join) on: one pub/sub connection.

Exactly once. The snapshot is the text of the tokens already forwarded to watchers (`forwarded`),
taken in the same step as the watcher is added, so a token is either in the snapshot or forwarded
to the new watcher, never both, never neither; a watcher's frames go one after another through one
queue, the snapshot first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from django.conf import settings

from core import redis as core_redis
from core.loops import PerLoop

logger = logging.getLogger(__name__)

JOIN_TIMEOUT = 2.0  # seconds a join waits for the process that runs the answer
MAX_WATCHERS = 16  # sockets watching one answer at most (tabs, devices)

Sink = Callable[[list[dict]], Awaitable[None]]


class Watcher:
    """One socket watching an answer: its frames queue here and go one send at a time."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.pending: list[dict] = []
        self.sending: asyncio.Task | None = None
        self.closed = False

    def push(self, frame: dict) -> None:
        if self.closed:
            return
        last = self.pending[-1] if self.pending else None
        if frame["type"] == "token" and last is not None and last["type"] == "token":
            self.pending[-1] = {"type": "token", "text": last["text"] + frame["text"]}
        else:
            self.pending.append(frame)
        if self.sending is None:
            self.sending = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        try:
            while self.pending and not self.closed:
                frames, self.pending = self.pending, []
                await self.sink(frames)
        except Exception as exc:  # noqa: BLE001 - a gone watcher must not touch the answer
            logger.info("a live answer's watcher is gone (%s: %s)", type(exc).__name__, exc)
            self.closed = True
        finally:
            self.sending = None


@dataclass(eq=False)
class LiveAnswer:
    """One answer this process is writing."""

    message_id: int
    user_id: int
    task: asyncio.Task
    parts: list[str]  # the turn's own list of the answer's tokens
    forwarded: int = 0  # tokens already sent to the watchers (the first `forwarded` of parts)
    route: dict | None = None  # the route frame, for a watcher that joins later
    watchers: dict[object, Watcher] = field(default_factory=dict)

    def token(self, text: str) -> None:
        """A token was sent to the asking socket: forward it to the watchers. Called for each
        token, so: a counter and, with no watcher, nothing else."""
        self.forwarded += 1
        if self.watchers:
            frame = {"type": "token", "text": text}
            for watcher in self.watchers.values():
                watcher.push(frame)

    def frame(self, frame: dict) -> None:
        if frame["type"] == "route":
            self.route = frame
        for watcher in self.watchers.values():
            watcher.push(frame)

    def watch(self, key: object, sink: Sink) -> bool:
        """Add a watcher: its first frame is the text so far. False: too many watchers."""
        if key not in self.watchers and len(self.watchers) >= MAX_WATCHERS:
            return False
        watcher = self.watchers[key] = Watcher(sink)
        watcher.push(self.resume())
        return True

    def resume(self) -> dict:
        route = self.route or {}
        return {
            "type": "resume",
            "message_id": self.message_id,
            "live": True,
            "status": "streaming",
            "text": "".join(self.parts[: self.forwarded]),
            "road": route.get("road"),
            "target": route.get("target"),
            "why": route.get("why"),
        }

    def unwatch(self, key: object) -> None:
        watcher = self.watchers.pop(key, None)
        if watcher is not None:
            watcher.closed = True


_answers: dict[int, LiveAnswer] = {}


def begin(*, message_id: int, user_id: int, task: asyncio.Task, parts: list[str]) -> LiveAnswer:
    """An answer this process writes, from now on joinable (the process's relay listens)."""
    relay().listen()
    answer = _answers[message_id] = LiveAnswer(message_id, user_id, task, parts)
    return answer


def end(answer: LiveAnswer, frame: dict | None) -> None:
    """The answer is over (`frame`: its last frame, for the watchers): no one can join it now."""
    if _answers.get(answer.message_id) is answer:
        del _answers[answer.message_id]
    if frame is not None:
        answer.frame(frame)


def running(message_id: int, user_id: int) -> LiveAnswer | None:
    answer = _answers.get(message_id)
    return answer if answer is not None and answer.user_id == user_id else None


# --- Across processes ----------------------------------------------------------------------


class Relay:
    """This process's line to the others, over Redis pub/sub: joins, stops and leaves for the
    answers it runs, and the frames of answers run elsewhere for the sockets here that watch
    them. Every relay hears the shared channel (joins); each has a channel of its own (replies,
    frames, stops, leaves). A process listens from its first answer or its first join on."""

    def __init__(self) -> None:
        prefix = f"{settings.REDIS_KEY_PREFIX}:chat:live"
        self.everyone = prefix
        self.channel = f"{prefix}:{uuid.uuid4().hex}"
        self.reader: asyncio.Task | None = None
        self.ready = asyncio.Event()
        self.watching: dict[str, Sink] = {}  # watcher id -> the local socket's sink
        self.replies: dict[str, asyncio.Future] = {}  # watcher id -> the owner's channel

    def listen(self) -> None:
        """Start listening (once)."""
        if self.reader is None:
            self.reader = asyncio.ensure_future(self._read())

    async def start(self) -> None:
        self.listen()
        if not self.ready.is_set():
            async with asyncio.timeout(JOIN_TIMEOUT):
                await self.ready.wait()

    async def _read(self) -> None:
        backoff = 1.0
        while True:
            pubsub = core_redis.aclient().pubsub()
            try:
                await pubsub.subscribe(self.everyone, self.channel)
                self.ready.set()
                backoff = 1.0
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        await self._handle_safely(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: joins wait, answers go on
                self.ready.clear()
                logger.warning(
                    "live relay: %s: %s; retrying in %.0f s", type(exc).__name__, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())

    async def _handle_safely(self, data: bytes) -> None:
        try:
            await self._handle(json.loads(data))
        except Exception:  # one bad message must not stop the relay
            logger.exception("live relay: could not handle a message")

    async def _publish(self, channel: str, message: dict) -> int:
        """Publish; returns how many relays heard it."""
        return await core_redis.aclient().publish(channel, json.dumps(message, ensure_ascii=False))

    async def _handle(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "join":
            answer = running(message["message_id"], message["user_id"])
            if answer is not None:
                reply_to, watcher = message["reply_to"], message["watcher"]
                answer.watch(watcher, self._remote_sink(reply_to, watcher))
        elif kind == "frames":
            watcher, frames = message["watcher"], message["frames"]
            future = self.replies.pop(watcher, None)
            if future is not None and not future.done():
                future.set_result(message["owner"])
            # The answer's last frame ends the watch here as it does at the owner: dropped before
            # it is sent, or every joined answer would leave its entry behind (the socket, done
            # watching, has no leave to send).
            if frames and frames[-1]["type"] in ("done", "error"):
                sink = self.watching.pop(watcher, None)
            else:
                sink = self.watching.get(watcher)
            if sink is not None:
                await sink(frames)
        elif kind == "stop":
            answer = running(message["message_id"], message["user_id"])
            if answer is not None:
                answer.task.cancel()
        elif kind == "leave":
            answer = _answers.get(message["message_id"])
            if answer is not None:
                answer.unwatch(message["watcher"])

    def _remote_sink(self, reply_to: str, watcher: str) -> Sink:
        async def send(frames: list[dict]) -> None:
            heard = await self._publish(
                reply_to,
                {"type": "frames", "watcher": watcher, "owner": self.channel, "frames": frames},
            )
            if not heard:
                raise RuntimeError("the watcher's process is not listening")

        return send

    async def join(self, *, message_id: int, user_id: int, watcher: str, sink: Sink) -> str | None:
        """Ask every process for the answer; the one running it replies. Returns its channel,
        or None when no process runs it (ended, or its process is gone)."""
        await self.start()
        reply = self.replies[watcher] = asyncio.get_running_loop().create_future()
        self.watching[watcher] = sink
        try:
            await self._publish(
                self.everyone,
                {
                    "type": "join",
                    "message_id": message_id,
                    "user_id": user_id,
                    "reply_to": self.channel,
                    "watcher": watcher,
                },
            )
            async with asyncio.timeout(JOIN_TIMEOUT):
                return await reply
        except TimeoutError:
            self.watching.pop(watcher, None)
            return None
        finally:
            self.replies.pop(watcher, None)

    async def leave(self, *, owner: str, message_id: int, watcher: str) -> None:
        self.watching.pop(watcher, None)
        with contextlib.suppress(Exception):
            await self._publish(
                owner, {"type": "leave", "message_id": message_id, "watcher": watcher}
            )

    async def stop(self, *, owner: str, message_id: int, user_id: int) -> None:
        await self._publish(owner, {"type": "stop", "message_id": message_id, "user_id": user_id})


_relays: PerLoop[Relay] = PerLoop()


def relay() -> Relay:
    """The running loop's relay (one per process: the serving loop's)."""
    found = _relays.get(Relay)
    if found.reader is not None and found.reader.done():  # cancelled with a loop's end
        found = _relays.put(Relay())
    return found
