"""WebSocket URL roots; each app owns its consumers."""

from chat.socket_urls import websocket_urlpatterns as chat_patterns
from observability.socket_urls import websocket_urlpatterns as observability_patterns

websocket_urlpatterns = [*chat_patterns, *observability_patterns]
