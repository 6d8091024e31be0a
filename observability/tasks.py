from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone


@shared_task(name="observability.tasks.requestlog_prune", time_limit=300)
def requestlog_prune_task() -> list[str]:
    """Retention: drop the request log's days older than REQUEST_LOG_DAYS (whole partitions: no
    bloat), and the KB misses, direct answers and verdicts as old, which hold the question asked,
    the answer given and what the user thought of it. The days dropped."""
    from knowledge.hits import hits_prune
    from knowledge.miss_groups import misses_prune
    from observability.requestlog import requestlog_prune

    now = timezone.now()
    days = requestlog_prune(now=now)
    misses_prune(before=now - timedelta(days=settings.REQUEST_LOG_DAYS))
    hits_prune(before=now - timedelta(days=settings.REQUEST_LOG_DAYS))
    return [day.isoformat() for day in days]
