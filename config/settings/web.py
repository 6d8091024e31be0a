"""The web processes: request bodies, readiness, warm-up and the graceful drain."""

from config.drain import drain_seconds
from core.env import env_bool, env_float, env_int

# --- Request bodies (config.body_limit) ----------------------------------------------------------

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int(
    "DATA_UPLOAD_MAX_MEMORY_SIZE", 1024 * 1024, minimum=1024
)  # request bodies
# multipart/form-data bodies (file uploads: the admin's KB import) may be this large; both limits
# are enforced by daphne as the body arrives, before anything reads it (config.body_limit).
WEB_MAX_UPLOAD_SIZE = env_int("WEB_MAX_UPLOAD_SIZE", 16 * 1024 * 1024, minimum=1024)

# --- Health (config.health, config.warmup) ------------------------------------------------------

READYZ_TIMEOUT = env_float("READYZ_TIMEOUT", 1.0, minimum=0.05)
# A process checks its dependencies at most this often and answers the probes in between with that
# verdict: anyone may call /readyz, and each check is a query, a Redis round trip and a Celery ping.
READYZ_CACHE_SECONDS = env_float("READYZ_CACHE_SECONDS", 3.0, minimum=0.0)
# Each web process loads the embedding model, the routing rules and its connections before it
# listens (config.warmup), instead of inside its first request.
WEB_WARMUP = env_bool("WEB_WARMUP", True)

# --- Graceful drain (config.drain) ---------------------------------------------------------------
# On SIGTERM a web process stops taking new chats (/readyz answers 503, `draining`) and gives the
# streams running up to WEB_DRAIN_SECONDS to finish; those still running then end, stored as
# partial. The supervisor's grace before SIGKILL (Kubernetes' terminationGracePeriodSeconds,
# Compose's stop_grace_period) must be longer; config.web reads the same variable for its own
# (config.drain.drain_seconds: one reader for both).
WEB_DRAIN_SECONDS = drain_seconds()
