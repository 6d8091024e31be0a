"""The browser chat's WebSocket consumer (the operations feed's is
observability.consumers). It rejects before accept when the user may not connect,
so an unauthorised browser never gets an open socket."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

from django.conf import settings

from chat import live
from chat.exceptions import ChatError
from chat.joins import AnswerJoins
from chat.turn_request import TurnRequest
from chat.turns import SessionEvent, areads_route_details, run_turn
from core import db
from core.errors import DomainError, unavailable
from core.sockets import JsonFramesConsumer, asocket_login_ended
from core.threads import own_thread
from routing.events import Token

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ChatConsumer(AnswerJoins, JsonFramesConsumer):
    """The browser chat. Protocol (JSON frames):

    client: {"type": "message", "session": ID or null, "content": "…"}, {"type": "stop"},
            {"type": "regenerate", "message_id": ID} (the last answer, answered again),
            {"type": "edit", "message_id": ID, "content": "…"} (the last question, replaced)
    server: {"type": "session", "id", "title", "message_id", "question_id"},
            {"type": "route", "road", "rule", "target", "why", "message_id"},
            {"type": "token", "text"},
            {"type": "done", "message_id", "ttft_ms", "latency_ms", "usage", "citations", "road",
             "target", "status", "overhead_ms"},
            {"type": "error", "code", "message", "message_id", "status"}

    A route's `why` and an engine failure's message are plain for a user; the staff who may read the
    routing rules get the details (chat.turns.reads_route_details).

    client: {"type": "join", "message_id": N} — watch an answer of the user's that is still being
            written (after a reload, in another tab): chat.live
    server: {"type": "resume", "message_id", "live", "status", "text", "road", "target", "why"},
            then, while `live`, the answer's frames as above; Stop stops the answer watched.

    One answer at a time per socket; it runs as its own task so Stop is heard while tokens flow.
    The answer outlives the socket: when the socket closes once the answer is stored as started,
    it goes on, is stored whole, and any socket of the user's can join it meanwhile.
    Each question, join and Stop first checks that the login which opened the socket still holds
    (no logout, expiry, password change or deactivation since): if not, an error frame says so,
    nothing more is sent, and the socket closes with 4401, as a socket opened without a login is
    refused. Joins count against the user's CHAT_JOIN_RATE_LIMIT per CHAT_RATE_WINDOW (each costs
    a statement, and one of an answer run elsewhere a publish and a wait); a frame longer than
    CHAT_SOCKET_MAX_FRAME_CHARS is refused unread.

    No channel layer of its own: a socket does not depend on Redis to stay open (a Redis outage
    is an `unavailable` error frame). Only a join of an answer run by another process goes
    through the channel layer, by the process's relay (chat.live).
    """

    channel_layer_alias = None  # type: ignore[assignment]  # this consumer uses no layer

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.user = user
        self.session_key = self.scope["session"].session_key
        self.task: asyncio.Task | None = None
        self.live: live.LiveAnswer | None = None  # the answer this socket's task is writing
        self.watched = None  # an answer this socket joined (chat.joins)
        self.gone = False
        await self.accept()

    async def disconnect(self, code):
        self.gone = True
        await self._unwatch()
        task = getattr(self, "task", None)
        if task is None or task.done():
            return
        if getattr(self, "live", None) is None or task.cancelling():
            # Gone before the answer was stored as started (nothing to come back to), or stopped:
            # stop generating upstream, and end with the turn saved. Otherwise the answer goes on
            # without this socket.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _send(self, frame: dict):
        await self._deliver(json.dumps(frame, ensure_ascii=False))

    async def _deliver(self, text: str) -> None:
        """Send a frame while the socket is open. A socket that closed under the answer (before
        its disconnect is handled) costs the answer nothing: it goes on, and is stored whole."""
        if self.gone:
            return
        try:
            await self.send(text_data=text)
        except Exception as exc:  # noqa: BLE001 - the socket is gone, not the answer
            logger.info("chat socket closed under its answer (%s: %s)", type(exc).__name__, exc)
            self.gone = True

    async def receive(self, text_data=None, bytes_data=None):
        if self.gone:
            return  # closing (its login ended) or closed
        size, limit = len(text_data or bytes_data or ""), settings.CHAT_SOCKET_MAX_FRAME_CHARS
        if size > limit:
            # Refused before it is parsed: a frame's JSON costs memory and CPU in proportion.
            await self._send(
                {
                    "type": "error",
                    "code": "frame_too_large",
                    "message": f"A frame may have at most {limit} characters; this one has {size}.",
                }
            )
            return
        try:
            frame = json.loads(text_data or "")
        except ValueError:
            await self._send(
                {"type": "error", "code": "bad_json", "message": "Frames must be JSON text."}
            )
            return
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "stop":
            await self._stop()
            return
        if kind in ("regenerate", "edit"):
            await self._redo(kind, frame)
            return
        if kind not in ("message", "join"):
            await self._send(
                {
                    "type": "error",
                    "code": "unknown_type",
                    "message": 'Client frames are {"type": "message", …}, {"type": "join", …}, '
                    '{"type": "stop"}, {"type": "regenerate", …} and {"type": "edit", …}.',
                }
            )
            return
        if await self._busy():
            return
        if kind == "join":
            message_id = frame.get("message_id")
            if not isinstance(message_id, int) or isinstance(message_id, bool):
                await self._send(
                    {"type": "error", "code": "bad_request", "message": "message_id must be an id."}
                )
                return
            with db.unbound():  # its statements on the loop's pool, not through a thread
                await self._refusing(message_id, self._join_checked(message_id))
            return
        session = frame.get("session")
        if session is not None and (not isinstance(session, int) or isinstance(session, bool)):
            await self._send(
                {
                    "type": "error",
                    "code": "bad_request",
                    "message": "session must be an id or null.",
                }
            )
            return
        self.task = asyncio.create_task(
            self._answer(session, frame.get("content"), time.monotonic())
        )

    async def _login_holds(self) -> bool:
        """Whether the login that opened the socket still holds (core.sockets): checked before
        each question, join and Stop, since a socket outlives a logout, a password change or a
        deactivation. If it ended: an error frame says so, nothing more goes out (not the tokens
        of an answer still being written, nor a joined one's), and the socket closes with 4401.
        Its answers already running go on, as they would had the socket closed."""
        ended = await asocket_login_ended(user=self.user, session_key=self.session_key)
        if ended is None:
            return True
        code, message = ended
        # Gone first: a token sent while this frame is on its way would follow it.
        self.gone = True
        await self._unwatch()
        with contextlib.suppress(Exception):  # the socket may be closed already
            await self.send(
                text_data=json.dumps(
                    {
                        "type": "error",
                        "code": code,
                        "message": message,
                        "message_id": None,
                        "status": None,
                    },
                    ensure_ascii=False,
                )
            )
            await self.close(code=4401)
        return False

    async def _stop(self) -> None:
        """Stop the answer this socket asked or joined, if its login still holds. With nothing to
        stop, nothing is checked: a Stop costs a statement only when it stops something."""
        task = self.task
        asked = task is not None and not task.done() and not task.cancelling()
        if not asked and self.watched is None:
            return
        with db.unbound():
            if not await self._refusing(None, self._login_holds()):
                return
        if asked:
            task.cancel()  # type: ignore[union-attr]  # asked: a task runs
        else:
            await self._stop_watched()

    async def _refusing(self, message_id: int | None, work: Awaitable[T]) -> T | None:
        """`work`'s result; a limit or an outage instead becomes an error frame (and None)."""
        try:
            return await work
        except Exception as exc:
            refusal = exc if isinstance(exc, ChatError) else unavailable(exc)
            if refusal is None:
                raise
            await self._send(_refused(refusal, message_id))
            return None

    async def _busy(self) -> bool:
        """One answer at a time (asked or joined): say so when one is streaming."""
        if (self.task is None or self.task.done()) and self.watched is None:
            return False
        await self._send(
            {
                "type": "error",
                "code": "busy",
                "message": "An answer is still streaming; stop it or wait for it to finish.",
            }
        )
        return True

    async def _redo(self, kind, frame):
        """A new version of the last exchange, streamed like any answer (chat.turns.run_turn)."""
        if await self._busy():
            return
        message_id = frame.get("message_id")
        if not isinstance(message_id, int) or isinstance(message_id, bool):
            await self._send(
                {"type": "error", "code": "bad_request", "message": "message_id must be an id."}
            )
            return
        self.task = asyncio.create_task(
            self._answer(None, frame.get("content"), time.monotonic(), **{kind: message_id})
        )

    async def _answer(self, session_id, content, arrived, **redo):
        # The turn's statements on the event loop (core.db.unbound); anything that still runs
        # thread-sensitive in a thread of its own: outside an HTTP request, every socket of the
        # process would otherwise share one thread for it.
        async with own_thread():
            with db.unbound():
                await self._run(session_id, content, arrived, **redo)

    async def _run(self, session_id, content, arrived, **redo):
        message_id = None
        parts: list[str] = []
        try:
            if not await self._login_holds():
                return
            details = await areads_route_details(self.user)
            turn = TurnRequest(user=self.user, content=content, session_id=session_id, **redo)
            async for event in run_turn(turn, arrived=arrived, parts=parts):
                if type(event) is Token:
                    if self.live is not None:  # before the await: a Stop then cannot split them
                        self.live.token(event.text)
                    if not self.gone:
                        await self._deliver(
                            '{"type": "token", "text": '
                            + json.dumps(event.text, ensure_ascii=False)
                            + "}"
                        )
                    continue
                frame = event.as_dict(details=details)
                if isinstance(event, SessionEvent):
                    message_id = event.message_id
                    # Stored as started: from here on, the answer can be joined.
                    self.live = live.begin(
                        message_id=message_id,
                        user_id=self.user.pk,
                        task=self.task,  # type: ignore[arg-type]  # the answer runs in self.task
                        parts=parts,
                    )
                elif event.type in ("route", "done", "error"):
                    frame["message_id"] = message_id
                    if event.type == "done":
                        frame["status"] = "complete"
                    elif event.type == "error":
                        frame["status"] = "partial" if event.partial else "failed"  # type: ignore[attr-defined]  # an error event
                await self._send(frame)
                self._to_watchers(frame)
        except ChatError as exc:
            await self._send(_refused(exc, None))
        except asyncio.CancelledError:
            stopped = {
                "type": "error",
                "code": "cancelled",
                "message": "Stopped.",
                "message_id": message_id,
                "status": "cancelled",
            }
            self._to_watchers(stopped)
            with contextlib.suppress(Exception):
                await self._send(stopped)
            raise
        except Exception as exc:  # one failed answer must not kill the socket
            outage = unavailable(exc)
            if outage is None:
                logger.exception("chat answer failed")
                failed = {
                    "type": "error",
                    "code": "internal",
                    "message": "The answer failed unexpectedly.",
                    "message_id": message_id,
                    "status": "failed",
                }
            else:
                logger.warning("chat answer failed: %s (%s: %s)", outage, type(exc).__name__, exc)
                failed = {
                    "type": "error",
                    "code": outage.code,
                    "message": str(outage),
                    "message_id": message_id,
                    "status": "failed" if message_id is not None else None,
                    "retry_after": outage.retry_after,
                }
            self._to_watchers(failed)
            await self._send(failed)
        finally:
            if self.live is not None:
                live.end(self.live, None)
                self.live = None

    def _to_watchers(self, frame: dict) -> None:
        """A frame of this socket's answer for the sockets that joined it; its last frame ends
        it, and no socket can join it after."""
        answer = self.live
        if answer is None:
            return
        if frame["type"] in ("done", "error"):
            self.live = None
            live.end(answer, frame)
        else:
            answer.frame(frame)


def _refused(exc: DomainError, message_id: int | None) -> dict:
    """The error frame of a question or join refused before it began (a limit, bad input, an
    outage)."""
    return {
        "type": "error",
        "code": exc.code,
        "message": str(exc),
        "message_id": message_id,
        "status": None,
        **({"retry_after": exc.retry_after} if hasattr(exc, "retry_after") else {}),
    }
