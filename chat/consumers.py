"""WebSocket consumers. Each rejects before accept when the user may not connect,
so an unauthorised browser never gets an open socket."""

import json

from channels.generic.websocket import AsyncWebsocketConsumer

from config.events import OPS_GROUP


class OpsConsumer(AsyncWebsocketConsumer):
    """Live operations feed for staff: engine state changes, bulk-job progress.

    Client frames: {"type": "ping"}. Server frames: {"type": "hello"},
    {"type": "pong"}, {"type": "event", "kind": …, "data": {…}},
    {"type": "error", "code": …, "message": …}.
    """

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=4403)
            return
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
        await self._send({"type": "pong"})

    async def ops_event(self, event):
        await self._send({"type": "event", "kind": event["kind"], "data": event["data"]})

    async def _error(self, code: str, message: str):
        await self._send({"type": "error", "code": code, "message": message})

    async def _send(self, frame: dict):
        await self.send(text_data=json.dumps(frame, ensure_ascii=False))
