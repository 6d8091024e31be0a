from celery import shared_task
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
