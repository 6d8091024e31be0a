"""The chat socket's joins: a socket watching an answer of the user's that is being written (after
a reload, in another tab), by this process (chat.live) or another (its relay), or the answer as
stored when none is. A mixin of chat.consumers.ChatConsumer."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chat import live
from chat.models import ChatSession, Message
from chat.services import ajoin_admit
from core import db

logger = logging.getLogger(__name__)


class AnswerJoins:
    """Joining, watching, stopping and leaving an answer of the user's (the consumer's `join` and
    `stop` frames)."""

    # The consumer's (chat.consumers.ChatConsumer).
    user: Any
    watched: _Watched | None
    _send: Callable[[dict], Awaitable[None]]
    _login_holds: Callable[[], Awaitable[bool]]

    async def _join_checked(self, message_id: int) -> None:
        """A join, counted against the user's limit (chat.services.ajoin_admit: before the
        statements it costs), once the login is found to hold."""
        await ajoin_admit(user_id=self.user.pk)
        if await self._login_holds():
            await self._join(message_id)

    async def _join(self, message_id: int) -> None:
        """Watch the user's answer `message_id`: the text so far, then its live frames. Run
        elsewhere, or over: the stored answer as it is."""
        answer = live.running(message_id, self.user.pk)
        if answer is not None:  # written by this process: the user's, running; no statement
            self.watched = _Watched(message_id, owner=None, key=self)
            if answer.watch(self, self._watching):
                return
            self.watched = None
        row = await _stored(message_id, self.user.pk)
        if row is None:
            await self._send(
                {
                    "type": "error",
                    "code": "not_found",
                    "message": f"You have no answer {message_id}.",
                    "message_id": message_id,
                    "status": None,
                }
            )
            return
        if row["status"] == "streaming" and answer is None:  # written by another process
            key = uuid.uuid4().hex
            self.watched = _Watched(message_id, owner=None, key=key)
            try:
                owner = await live.relay().join(
                    message_id=message_id,
                    user_id=self.user.pk,
                    watcher=key,
                    sink=self._watching,
                )
            except Exception as exc:  # noqa: BLE001 - Redis away: the stored answer
                logger.warning("join of answer %s failed: %s", message_id, exc)
                owner = None
            if owner is not None:
                if self.watched is not None and self.watched.key == key:
                    self.watched.owner = owner
                return
            self.watched = None
            row = await _stored(message_id, self.user.pk) or row  # it may have ended meanwhile
        await self._send(_resume_stored(row))

    async def _watching(self, frames: list[dict]) -> None:
        """Frames of the answer this socket joined, in order."""
        for frame in frames:
            if frame["type"] in ("done", "error"):
                self.watched = None
            await self._send(frame)

    async def _stop_watched(self) -> None:
        watched = self.watched
        if watched is None:
            return
        answer = live.running(watched.message_id, self.user.pk)
        if answer is not None:
            answer.task.cancel()
        elif watched.owner is not None:
            with contextlib.suppress(Exception):
                await live.relay().stop(
                    owner=watched.owner, message_id=watched.message_id, user_id=self.user.pk
                )

    async def _unwatch(self) -> None:
        watched, self.watched = getattr(self, "watched", None), None
        if watched is None:
            return
        answer = live.running(watched.message_id, self.user.pk)
        if answer is not None:
            answer.unwatch(watched.key)
        elif watched.owner is not None:
            await live.relay().leave(
                owner=watched.owner, message_id=watched.message_id, watcher=watched.key
            )


@dataclass
class _Watched:
    message_id: int
    owner: str | None  # the relay channel of the process running it; None: this process
    key: object  # the watcher's key there


async def _stored(message_id: int, user_id: int) -> dict | None:
    """The user's answer `message_id` as stored (one statement), or None."""
    row = await db.query_one(_STORED_SQL, [message_id, user_id, Message.Role.ASSISTANT])
    if row is None:
        return None
    status, content, road, target = row
    return {"status": status, "content": content, "road": road, "target": target, "id": message_id}


_STORED_SQL = (
    f"SELECT m.status, m.content, m.road, m.target FROM {Message._meta.db_table} m "  # noqa: S608 - _meta's names; values are parameters
    f"JOIN {ChatSession._meta.db_table} s ON s.id = m.session_id "
    "WHERE m.id = %s AND s.user_id = %s AND m.role = %s"
)


def _resume_stored(row: dict) -> dict:
    """A resume frame for an answer no process is writing: as stored. One still marked
    streaming has lost its process (it is stored as partial when a process ends in order)."""
    status = row["status"]
    return {
        "type": "resume",
        "message_id": row["id"],
        "live": False,
        "status": "partial" if status == "streaming" else status,
        "text": row["content"],
        "road": row["road"] or None,
        "target": row["target"] or None,
        "why": None,
    }
