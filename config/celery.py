"""The Celery app. Its configuration is the CELERY_* block of config/settings.py.

Queues: `default`, `ops` (engine supervision; consumed only on the host that owns
the GPU) and `embeddings` (KB vectors). The development worker consumes all three.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

QUEUES = ("default", "ops", "embeddings")

app = Celery("gateway")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
