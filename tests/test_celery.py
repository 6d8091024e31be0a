from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from chat.tasks import sessions_clear_expired
from config.celery import app

def _session(expires_in: timedelta) -> str:
    store = SessionStore()
    store["who"] = "someone"
    store.create()
    Session.objects.filter(session_key=store.session_key).update(expire_date=timezone.now() + expires_in)
    return store.session_key


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_clears_expired_sessions_through_redis(celery_worker):
    expired = _session(timedelta(days=-1))
    live = _session(timedelta(days=1))

    result = sessions_clear_expired.delay()

    assert result.get(timeout=60) == 1
    assert not Session.objects.filter(session_key=expired).exists()
    assert Session.objects.filter(session_key=live).exists()


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("inference_ops.tasks.engine_start", "ops"),
        ("knowledge.tasks.entry_embed", "embeddings"),
        ("chat.tasks.sessions_clear_expired", "default"),
    ],
)
def test_tasks_are_routed_to_their_queue_by_app(task, queue):
    assert app.amqp.router.route({}, task)["queue"].name == queue


def test_the_beat_schedule_is_in_code():
    assert app.conf.beat_schedule["clear-expired-sessions"]["task"] == "chat.tasks.sessions_clear_expired"
    assert app.conf.task_serializer == "json"
    assert app.conf.accept_content == ["json"]
    assert app.conf.task_time_limit > app.conf.task_soft_time_limit
