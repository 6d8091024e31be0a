"""The operations feed: engine state changes and bulk-job progress, live to the staff who may
view the engines. It rejects before accept when the user may not connect, so an unauthorised
browser never gets an open socket."""

import json

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef

from core import db
from core.events import OPS_GROUP
from core.sockets import JsonFramesConsumer, asocket_login_ended


class OpsConsumer(JsonFramesConsumer):
    """Live operations feed for staff who may view the engines: engine state changes (with their
    failure reasons), bulk-job progress.

    Client frames: {"type": "ping"}. Server frames: {"type": "hello"},
    {"type": "pong"}, {"type": "event", "kind": …, "data": {…}},
    {"type": "error", "code": …, "message": …}.

    The socket outlives the login that opened it, so each event and each ping first checks that
    the login still holds and is still staff's with the engines' view permission; if not, an
    error frame says why and the socket closes with 4403, the code a socket opened without them
    gets. Events are state changes, few enough that a check each (two statements by primary key)
    costs less than a timer would, and no event leaves once a demotion, a permission taken away
    or a logout is committed.
    """

    async def connect(self):
        user = self.scope.get("user")
        if (
            user is None
            or not user.is_authenticated
            or await db.run(_ops_refusal, user.pk) is not None
        ):
            await self.close(code=4403)
            return
        self.user = user
        self.session_key = self.scope["session"].session_key
        self.refused = False
        await self.channel_layer.group_add(OPS_GROUP, self.channel_name)
        await self.accept()
        await self._send({"type": "hello", "user": user.get_username()})

    async def disconnect(self, code):
        await self.channel_layer.group_discard(OPS_GROUP, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            frame = json.loads(text_data or "")
        except ValueError:
            await self._error("bad_json", "Frames must be JSON text.")
            return
        if not isinstance(frame, dict) or frame.get("type") != "ping":
            await self._error("unknown_type", 'The only client frame here is {"type": "ping"}.')
            return
        if await self._login_holds():
            await self._send({"type": "pong"})

    async def ops_event(self, event):
        if await self._login_holds():
            await self._send({"type": "event", "kind": event["kind"], "data": event["data"]})

    async def _login_holds(self) -> bool:
        if self.refused:
            return False  # closing: events queued before the close are dropped, not checked again
        ended = await asocket_login_ended(user=self.user, session_key=self.session_key)
        if ended is None:
            ended = await db.run(_ops_refusal, self.user.pk)
        if ended is None:
            return True
        self.refused = True
        await self._error(*ended)
        await self.close(code=4403)
        return False

    async def _error(self, code: str, message: str):
        await self._send({"type": "error", "code": code, "message": message})


# The feed shows the engines' status and why they failed: what the engines' admin list shows.
OPS_PERMISSION = "inference_ops.view_engineprocess"


def _ops_refusal(user_id) -> tuple[str, str] | None:
    """Why this user may not watch the feed, as (code, message), or None when they may.

    One statement, read fresh each time: `user.has_perm` would cache the permissions on the user
    object for the life of the socket (and cost two more statements to fill that cache), so a
    permission taken away would go unnoticed. `with_perm` asks the same question of the model
    backend, counting the user's own permission, a group's and a superuser's.
    """
    users = get_user_model().objects
    row = (
        users.filter(pk=user_id)
        .annotate(may_view=Exists(users.with_perm(OPS_PERMISSION).filter(pk=OuterRef("pk"))))
        .values_list("is_staff", "may_view")
        .first()
    )
    if row is None or not row[0]:
        return "not_staff", "This account is no longer staff: the operations feed is closed."
    if not row[1]:
        return (
            "no_permission",
            "This account may no longer view the engines: the operations feed is closed.",
        )
    return None
