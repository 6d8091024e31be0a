"""The Celery app. Its configuration is the CELERY_* names of config/settings/worker.py.

Queues: `default`, `ops` (engine supervision; consumed only on the host that owns
the GPU) and `embeddings` (KB vectors). The development worker consumes all three.
"""

import os

from celery import Celery
from celery.signals import worker_init
from django.core.exceptions import ImproperlyConfigured

from config.bootstrap import process_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

QUEUES = ("default", "ops", "embeddings")

app = Celery("gateway")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_configure.connect
def _process_setup(**kwargs):
    # Before Celery reads the settings, which in a worker or beat is before Django sets up: the
    # process prepares as every entry point does. Once per process (a web process has already).
    try:
        process_setup()
    except ImproperlyConfigured as exc:
        # SystemExit, not the exception: Celery logs a receiver's exceptions and goes on.
        raise SystemExit(f"Configuration error: {exc}") from None


def redelivery_problems(celery_app: Celery = app) -> list[str]:
    """Tasks that may still run when Redis hands their message to another worker.

    With late acknowledgement, Redis gives an unacknowledged message to a second worker once the
    visibility timeout has passed: a task allowed to run longer would run twice at once.
    """
    celery_app.loader.import_default_modules()  # every task registered, as in a worker
    visibility = celery_app.conf.broker_transport_options.get("visibility_timeout", 3600)
    problems = []
    for name, task in sorted(celery_app.tasks.items()):
        limit = task.time_limit or celery_app.conf.task_time_limit
        if limit is None or limit >= visibility:
            problems.append(
                f"{name} may run {limit or 'without a limit'} s, not less than the broker's "
                f"visibility timeout of {visibility} s"
            )
    return problems


@worker_init.connect
def _refuse_redelivery_of_running_tasks(sender=None, **kwargs):
    if problems := redelivery_problems():
        # SystemExit, not an exception: Celery logs a receiver's exceptions and starts anyway.
        raise SystemExit("Raise CELERY_VISIBILITY_TIMEOUT: " + "; ".join(problems))
