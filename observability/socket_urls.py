"""The operations feed's WebSocket URL (config.routing gathers every app's)."""

from django.urls import path

from observability import consumers

websocket_urlpatterns = [
    path("ws/ops/", consumers.OpsConsumer.as_asgi()),  # type: ignore[arg-type]  # Channels routes ASGI apps by path()
]
