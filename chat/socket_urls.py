"""The chat's WebSocket URL (config.routing gathers every app's)."""

from django.urls import path

from chat import consumers

websocket_urlpatterns = [
    path("ws/chat/", consumers.ChatConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps by path()
]
