"""PostgreSQL (with pgvector) and Redis: the database, the cache and the Channels layer."""

from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import DEBUG
from core.env import env_bool, env_float, env_int, env_str, env_url

# --- PostgreSQL (with pgvector) ------------------------------------------------------------------


def _database(url: str) -> dict:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    host = query.pop("host", None) or parts.hostname or ""
    options: dict = {}
    if "sslmode" in query:
        options["sslmode"] = query.pop("sslmode")
    options["connect_timeout"] = env_int("DATABASE_CONNECT_TIMEOUT", 5, minimum=1)
    pool_size = env_int("DATABASE_POOL_SIZE", 10, minimum=0)
    if pool_size:
        # A psycopg pool per process: under ASGI each request would otherwise pay a
        # fresh connection (and TLS handshake against a managed database).
        options["pool"] = {
            "min_size": 1,
            "max_size": pool_size,
            "timeout": env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # With the pool: each checkout first checks its connection (an empty query), so after a
        # database restart no request is handed a connection the restart broke (a 503 each).
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": env_str("DATABASE_TEST_NAME")},
    }


def _required(what: str) -> str:
    """An unset DATABASE_URL or REDIS_URL stops start-up. In development (DEBUG on) the entry
    points start the embedded server under var/ and set the variable before the settings are
    read (config.bootstrap): importing the settings starts nothing, and production never starts a
    database of its own by accident."""
    if not DEBUG:
        raise ImproperlyConfigured(
            f"Environment variable {what} must be set when DEBUG is off "
            "(the embedded server under var/ is for development and tests)."
        )
    raise ImproperlyConfigured(
        f"Environment variable {what} must be set (with DEBUG on, manage.py and make run start "
        "the embedded server under var/ and set it)."
    )


DATABASE_URL = env_url("DATABASE_URL", schemes=("postgres", "postgresql")) or _required(
    "DATABASE_URL"
)
DATABASES = {"default": _database(DATABASE_URL)}
# The event-loop pool's hot statements (core.db) as server-side prepared statements from their
# second run on a connection: PostgreSQL then plans each once per connection, not per request
# (what it saves: docs/benchmarks.md#fig-prepared-statements). Off for a pgbouncer before 1.21 in
# transaction mode, which cannot keep prepared statements. Django's own queries bind on the
# client, as Django does by default, and are never prepared.
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Channels layer, Celery broker, cache -------------------------------------------------

REDIS_URL = env_url("REDIS_URL", schemes=("redis", "rediss", "unix")) or _required("REDIS_URL")
REDIS_TIMEOUT = env_float("REDIS_TIMEOUT", 5.0, minimum=0.1)
# Every key this project writes starts with it: one Redis can serve several deployments (or test
# runs).
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "gw")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": REDIS_KEY_PREFIX,
        "OPTIONS": {
            "socket_connect_timeout": REDIS_TIMEOUT,
            "socket_timeout": REDIS_TIMEOUT,
            # Request threads share one pool; in a burst a thread waits for a free connection
            # (up to REDIS_TIMEOUT) instead of failing with "too many connections".
            "pool_class": "redis.BlockingConnectionPool",
            "max_connections": 64,
            "timeout": REDIS_TIMEOUT,
            # Not Django's pickles: a key written into Redis would run code here (core/cache.py).
            "serializer": "core.cache.JSONSerializer",
        },
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    # Longer than the layer's 5 s blocking pop: redis-py 8 defaults to a 5 s read
                    # timeout, which would race it and kill idle consumers.
                    "socket_timeout": 5 + REDIS_TIMEOUT + 5,
                    "socket_connect_timeout": REDIS_TIMEOUT,
                }
            ],
            "prefix": f"{REDIS_KEY_PREFIX}:asgi",
            "capacity": 1000,
            "expiry": 60,
        },
    }
}
