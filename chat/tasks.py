from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.contrib.sessions.models import Session
from django.utils import timezone


@shared_task(name="chat.tasks.sessions_clear_expired")
def sessions_clear_expired() -> int:
    """Delete expired browser sessions (the beat schedule runs it nightly). Returns how many."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted


@shared_task(name="chat.tasks.messages_fail_stale")
def messages_fail_stale_task() -> int:
    """Turns left streaming by a process that died end as failed, never lost."""
    from chat.services import messages_fail_stale

    return messages_fail_stale()


@shared_task(name="chat.tasks.requestlog_prune", time_limit=300)
def requestlog_prune_task() -> list[str]:
    """Retention: drop the request log's days older than REQUEST_LOG_DAYS (whole partitions: no
    bloat), and the KB misses as old, which hold the question asked and the answer given. The
    days dropped."""
    from chat.requestlog import requestlog_prune
    from knowledge.services import misses_prune

    now = timezone.now()
    days = requestlog_prune(now=now)
    misses_prune(before=now - timedelta(days=settings.REQUEST_LOG_DAYS))
    return [day.isoformat() for day in days]
