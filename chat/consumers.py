"""The browser chat's WebSocket consumer (the operations feed's is
observability.consumers). It rejects before accept when the user may not connect,
so an unauthorised browser never gets an open socket."""

import asyncio
import contextlib
import json
import logging
import time

from chat.exceptions import ChatError
from chat.turns import SessionEvent, areads_route_details, run_turn
from core import db
from core.errors import unavailable
from core.sockets import JsonFramesConsumer, asocket_login_ended
from core.threads import own_thread
from routing.events import Token

logger = logging.getLogger(__name__)


class ChatConsumer(JsonFramesConsumer):
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

    One answer at a time per socket; it runs as its own task so Stop is heard while tokens flow.
    Each question first checks that the login which opened the socket still holds (no logout,
    expiry, password change or deactivation since): if not, an error frame says so and the
    socket closes with 4401, as a socket opened without a login is refused.

    No channel layer: nothing is sent to a chat socket from elsewhere, and without one a socket
    does not depend on Redis to stay open (a Redis outage is an `unavailable` error frame).
    """

    channel_layer_alias = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.user = user
        self.session_key = self.scope["session"].session_key
        self.task: asyncio.Task | None = None
        await self.accept()

    async def disconnect(self, code):
        task = getattr(self, "task", None)
        if task is not None and not task.done():
            # The browser is gone: stop generating upstream; the turn is kept as cancelled.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def receive(self, text_data=None, bytes_data=None):
        try:
            frame = json.loads(text_data or "")
        except ValueError:
            await self._send(
                {"type": "error", "code": "bad_json", "message": "Frames must be JSON text."}
            )
            return
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "stop":
            if self.task is not None and not self.task.done():
                self.task.cancel()
            return
        if kind in ("regenerate", "edit"):
            await self._redo(kind, frame)
            return
        if kind != "message":
            await self._send(
                {
                    "type": "error",
                    "code": "unknown_type",
                    "message": 'Client frames are {"type": "message", …}, {"type": "stop"}, '
                    '{"type": "regenerate", …} and {"type": "edit", …}.',
                }
            )
            return
        if await self._busy():
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

    async def _busy(self) -> bool:
        """One answer at a time: say so when one is streaming."""
        if self.task is None or self.task.done():
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
        try:
            ended = await asocket_login_ended(user=self.user, session_key=self.session_key)
            if ended is not None:
                code, message = ended
                await self._send(
                    {
                        "type": "error",
                        "code": code,
                        "message": message,
                        "message_id": None,
                        "status": None,
                    }
                )
                await self.close(code=4401)
                return
            details = await areads_route_details(self.user)
            async for event in run_turn(
                user=self.user,
                content=content,
                session_id=session_id,
                client="web",
                arrived=arrived,
                **redo,
            ):
                if type(event) is Token:
                    await self.send(
                        text_data='{"type": "token", "text": '
                        + json.dumps(event.text, ensure_ascii=False)
                        + "}"
                    )
                    continue
                frame = event.as_dict(details=details)
                if isinstance(event, SessionEvent):
                    message_id = event.message_id
                elif event.type in ("route", "done", "error"):
                    frame["message_id"] = message_id
                    if event.type == "done":
                        frame["status"] = "complete"
                    elif event.type == "error":
                        frame["status"] = "partial" if event.partial else "failed"
                await self._send(frame)
        except ChatError as exc:
            await self._send(
                {
                    "type": "error",
                    "code": exc.code,
                    "message": str(exc),
                    "message_id": None,
                    "status": None,
                    **({"retry_after": exc.retry_after} if hasattr(exc, "retry_after") else {}),
                }
            )
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._send(
                    {
                        "type": "error",
                        "code": "cancelled",
                        "message": "Stopped.",
                        "message_id": message_id,
                        "status": "cancelled",
                    }
                )
            raise
        except Exception as exc:  # noqa: BLE001 - one failed answer must not kill the socket
            outage = unavailable(exc)
            if outage is None:
                logger.exception("chat answer failed")
                await self._send(
                    {
                        "type": "error",
                        "code": "internal",
                        "message": "The answer failed unexpectedly.",
                        "message_id": message_id,
                        "status": "failed",
                    }
                )
                return
            logger.warning("chat answer failed: %s (%s: %s)", outage, type(exc).__name__, exc)
            await self._send(
                {
                    "type": "error",
                    "code": outage.code,
                    "message": str(outage),
                    "message_id": message_id,
                    "status": "failed" if message_id is not None else None,
                    "retry_after": outage.retry_after,
                }
            )
