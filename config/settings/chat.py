"""Chat: message and frame sizes, per-user rates and streams, history, API keys."""

from core.env import env_float, env_int

CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 16000, minimum=100)  # longer: 413
CHAT_RATE_LIMIT = env_int("CHAT_RATE_LIMIT", 30, minimum=1)  # questions per user per window
CHAT_RATE_WINDOW = env_int("CHAT_RATE_WINDOW", 60, minimum=1)  # seconds
# Joins of a running answer (chat.live: a reload, another tab) per user per CHAT_RATE_WINDOW; each
# costs a statement, and across processes a publish and a wait. More: an error frame.
CHAT_JOIN_RATE_LIMIT = env_int("CHAT_JOIN_RATE_LIMIT", 60, minimum=1)
# The longest frame a chat socket reads (characters of its JSON text); longer is refused unread
# with an error frame. The longest question fits with every character escaped (\uXXXX).
CHAT_SOCKET_MAX_FRAME_CHARS = env_int(
    "CHAT_SOCKET_MAX_FRAME_CHARS",
    6 * CHAT_MAX_MESSAGE_CHARS + 1024,
    minimum=CHAT_MAX_MESSAGE_CHARS + 1024,
)
# Answers one user may have in progress at once, on every interface and process together (more:
# 429).
CHAT_MAX_STREAMS_PER_USER = env_int("CHAT_MAX_STREAMS_PER_USER", 8, minimum=1)
CHAT_HISTORY_TURNS = env_int(
    "CHAT_HISTORY_TURNS", 20, minimum=0
)  # earlier messages sent as context
# A found API key is trusted this long by each process without a database lookup (0: every call).
API_KEY_CACHE_SECONDS = env_float("API_KEY_CACHE_SECONDS", 5.0, minimum=0.0)
CHAT_STALE_STREAMING_AFTER = env_int("CHAT_STALE_STREAMING_AFTER", 900, minimum=60)  # seconds
# Inputs one /v1/embeddings request may hold (OpenAI's own limit is 2048): each is a model call's
# worth of work, the knowledge base's model runs on the gateway's CPU. More: 400.
V1_EMBEDDING_MAX_INPUTS = env_int("V1_EMBEDDING_MAX_INPUTS", 256, minimum=1, maximum=2048)
