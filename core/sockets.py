"""What the WebSocket consumers share (the chat's in chat.consumers, the operations feed's in
observability.consumers): JSON frames, and whether the login that opened a socket still holds."""

import functools
import json

from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from core import db


class JsonFramesConsumer(AsyncWebsocketConsumer):
    async def _send(self, frame: dict):
        await self.send(text_data=json.dumps(frame, ensure_ascii=False))


@functools.cache  # built once: the models' tables do not change while the process runs
def _socket_login_sql() -> str:
    from django.contrib.sessions.models import Session

    user_model = get_user_model()
    pk = user_model._meta.pk.column
    return (
        f"SELECT u.is_active, u.password, s.session_data FROM {user_model._meta.db_table} u "  # noqa: S608 - _meta's names; values are parameters
        f"LEFT JOIN {Session._meta.db_table} s ON s.session_key = %s AND s.expire_date > %s "
        f"WHERE u.{pk} = %s"
    )


async def asocket_login_ended(*, user, session_key: str | None) -> tuple[str, str] | None:
    """Why the login behind an open socket no longer holds, as (code, message), or None while it
    does.

    A socket stays open for hours, but its login can end meanwhile: a logout (the session row
    is deleted), the session's expiry, a password change elsewhere (Django then ends every
    other session: their stored hash no longer matches), the user deactivated or deleted. The
    socket checks before each question (the chat) or event (the operations feed): one statement
    by primary keys, on the event loop.
    """
    row = await db.query_one(_socket_login_sql(), [session_key or "", timezone.now(), user.pk])
    if row is not None and not row[0]:
        return (
            "account_inactive",
            "This account has been deactivated; log in again with an active account.",
        )
    if row is None or row[2] is None or not _session_verified(user, row[1], row[2]):
        return "logged_out", "You have been logged out; log in again to continue."
    return None


def _session_verified(user, password: str, session_data: str) -> bool:
    """As django.contrib.auth.get_user verifies a session: its user, and its hash of the
    password."""
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    data = SessionStore().decode(session_data)
    stored_hash = data.get(HASH_SESSION_KEY)
    if str(data.get(SESSION_KEY)) != str(user.pk) or not stored_hash:
        return False
    # The password as it is now, not at connect.
    current = get_user_model()(pk=user.pk, password=password)
    return any(
        constant_time_compare(stored_hash, expected)
        for expected in (current.get_session_auth_hash(), *current.get_session_auth_fallback_hash())
    )
