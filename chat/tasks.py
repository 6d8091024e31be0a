from celery import shared_task
from django.contrib.sessions.models import Session
from django.utils import timezone


@shared_task(name="chat.tasks.sessions_clear_expired")
def sessions_clear_expired() -> int:
    """Delete expired browser sessions (the beat schedule runs it nightly). Returns how many."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
