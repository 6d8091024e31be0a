"""WebSocket URL roots; each app owns its consumers."""

from chat.routing import websocket_urlpatterns as chat_patterns

websocket_urlpatterns = [*chat_patterns]
