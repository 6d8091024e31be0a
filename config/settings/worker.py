"""Celery: broker, task limits, queues and the beat schedule (read by config/celery.py with the
CELERY_ namespace)."""

from datetime import timedelta

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from config.settings.databases import REDIS_KEY_PREFIX, REDIS_TIMEOUT, REDIS_URL
from config.settings.inference import ENGINE_CHECK_INTERVAL
from core.env import env_int, env_url

CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", schemes=("redis", "rediss", "unix"), default=REDIS_URL
)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = timedelta(days=1)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int(
    "CELERY_TASK_TIME_LIMIT", CELERY_TASK_SOFT_TIME_LIMIT + 30, minimum=1
)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        "Environment variable CELERY_TASK_TIME_LIMIT must be greater than "
        "CELERY_TASK_SOFT_TIME_LIMIT."
    )
# Tasks are idempotent (they re-read their rows), so a task lost with its worker runs again.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    # Engine processes live on the host that owns the GPU: only its worker consumes `ops`.
    "inference_ops.tasks.*": {"queue": "ops"},
    "knowledge.tasks.*": {"queue": "embeddings"},
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_TIMEOUT
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longer than the longest hard time limit of any task (an engine start, the KB re-embed), or
    # Redis would hand a running task to a second worker; the worker refuses to start otherwise.
    "visibility_timeout": env_int(
        "CELERY_VISIBILITY_TIMEOUT", max(7200, CELERY_TASK_TIME_LIMIT * 2), minimum=60
    ),
    "socket_timeout": REDIS_TIMEOUT,
    "socket_connect_timeout": REDIS_TIMEOUT,
    "global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:",
}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:"}
CELERY_REDIS_SOCKET_TIMEOUT = REDIS_TIMEOUT
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = REDIS_TIMEOUT
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_BEAT_SCHEDULE = {
    "check-engines": {
        "task": "inference_ops.tasks.engines_check_all",
        "schedule": ENGINE_CHECK_INTERVAL,
        # A check older than its interval is useless: drop it rather than pile them up.
        "options": {"expires": ENGINE_CHECK_INTERVAL},
    },
    # Endpoints no engine row runs (a production-stack router, llm-d's gateway): health and load.
    "check-endpoints": {
        "task": "inference_ops.tasks.endpoints_check_all",
        "schedule": ENGINE_CHECK_INTERVAL,
        "options": {"expires": ENGINE_CHECK_INTERVAL, "queue": "default"},
    },
    "fail-stale-chat-turns": {"task": "chat.tasks.messages_fail_stale", "schedule": 300.0},
    # Drops the request log's days past REQUEST_LOG_DAYS, makes tomorrow's partition ahead.
    "prune-request-log": {
        "task": "observability.tasks.requestlog_prune",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    # Requests only append misses; this places them in groups for the curators' list.
    "group-kb-misses": {
        "task": "knowledge.tasks.misses_group",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "clear-expired-sessions": {
        "task": "chat.tasks.sessions_clear_expired",
        "schedule": crontab(hour=3, minute=17),
    },
}
