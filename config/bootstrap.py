"""What a process does before Django loads its apps: the side effects importing the settings must
not have (config.settings reads the environment and nothing else).

Every entry point calls `process_setup()` before Django sets up: manage.py, config.asgi (each
web process), config.wsgi, the Celery worker and beat (config.celery), `make run`
(devtools.devserver) and deploy/build_embedder.py. The test settings (tests/settings.py) start
the test run's own servers and call `folders_make` themselves.
"""

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from core.env import env_bool, var_dir

_done = False
# The variables development_environ filled from the embedded servers (devtools.embedded): a
# process that started or reused them, and holds them while it runs (benchmarks.stack).
_embedded: set[str] = set()


def process_setup() -> None:
    """Prepare this process, once: in development the conveniences that start servers or write
    files, then the settings read and the folders they name made. A bad environment raises
    ImproperlyConfigured naming the variable, as the settings do."""
    global _done
    if _done:
        return
    # The test settings provide their own servers and key (tests/settings.py).
    if os.environ.get("DJANGO_SETTINGS_MODULE") == "config.settings" and env_bool("DEBUG", False):
        development_environ()
    from django.conf import settings

    folders_make(var=settings.VAR_DIR, metrics=settings.METRICS_DIR)
    _done = True


def development_environ() -> None:
    """With DEBUG on: a SECRET_KEY kept under var/ (one random key per checkout, so sessions
    survive restarts) and, for an unset DATABASE_URL or REDIS_URL, the embedded server's, started
    or reused (devtools.embedded). Written into os.environ, so the settings and every process
    started from here find them. Production sets all three; an unset one stops start-up."""
    if not _is_set("SECRET_KEY"):
        path = var_dir() / "dev-secret-key"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(50))
            path.chmod(0o600)
        os.environ["SECRET_KEY"] = path.read_text().strip()
    # Imported here: the embedded servers are development's (requirements-dev.txt), not the image's.
    if not _is_set("DATABASE_URL"):
        from devtools import embedded

        os.environ["DATABASE_URL"] = embedded.postgres_url()
        _embedded.add("DATABASE_URL")
    if not _is_set("REDIS_URL"):
        from devtools import embedded

        os.environ["REDIS_URL"] = embedded.redis_url()
        _embedded.add("REDIS_URL")


def uses_embedded(name: str) -> bool:
    """Whether this process set `name` (DATABASE_URL, REDIS_URL) to the embedded server's: it
    was unset, so the environment's own value cannot tell any more."""
    return name in _embedded


def folders_make(*, var: Path, metrics: Path) -> None:
    """Make the gateway's folder (VAR_DIR) and the metrics folder (METRICS_DIR), and name the
    latter in PROMETHEUS_MULTIPROC_DIR before any app imports prometheus_client, which reads the
    variable once, on import: every process of a host then counts into that one folder, and a
    scrape of any web process adds them up (config.metrics)."""
    var.mkdir(parents=True, exist_ok=True)
    try:
        metrics.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(
            "Environment variable PROMETHEUS_MULTIPROC_DIR must name a folder that can be "
            f"created; {exc}."
        ) from None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)


def _is_set(name: str) -> bool:
    # As the settings read it (core.env): blank is unset.
    return bool(os.environ.get(name, "").strip())
