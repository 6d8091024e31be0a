import subprocess
from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from chat.tasks import sessions_clear_expired
from config.celery import app, redelivery_problems
from devtools.workers import worker_command
from tests.support.processes import BASE_DIR


def _session(expires_in: timedelta) -> str:
    store = SessionStore()
    store["who"] = "someone"
    store.create()
    Session.objects.filter(session_key=store.session_key).update(
        expire_date=timezone.now() + expires_in
    )
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
        ("observability.tasks.requestlog_prune", "default"),
    ],
)
def test_tasks_are_routed_to_their_queue_by_app(task, queue):
    assert app.amqp.router.route({}, task)["queue"].name == queue


def test_the_beat_schedule_is_in_code():
    assert (
        app.conf.beat_schedule["clear-expired-sessions"]["task"]
        == "chat.tasks.sessions_clear_expired"
    )
    assert app.conf.task_serializer == "json"
    assert app.conf.accept_content == ["json"]
    assert app.conf.task_time_limit > app.conf.task_soft_time_limit


def test_every_beat_entry_names_a_task_a_worker_knows():
    # A task renamed or moved to another app leaves its old name in the schedule otherwise.
    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert "observability.tasks.requestlog_prune" in scheduled
    assert scheduled - set(app.tasks) == set()


def test_the_broker_never_hands_a_running_task_to_a_second_worker():
    app.loader.import_default_modules()
    visibility = app.conf.broker_transport_options["visibility_timeout"]
    limits = {name: task.time_limit or app.conf.task_time_limit for name, task in app.tasks.items()}
    # The long ones are there: an engine start waits for vLLM to load weights, the re-embed is the
    # KB.
    assert (
        limits["inference_ops.tasks.engine_start"] > 3600
        and limits["knowledge.tasks.kb_reembed"] > 3600
    )
    assert {name: limit for name, limit in limits.items() if limit >= visibility} == {}
    assert redelivery_problems() == []


@pytest.mark.processes
def test_a_worker_refuses_to_start_when_a_task_could_outlive_the_visibility_timeout(child_env):
    env = {**child_env, "CELERY_VISIBILITY_TIMEOUT": "3600"}
    result = subprocess.run(
        worker_command(hostname="refused@%h", concurrency=1, queues="nothing"),
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Raise CELERY_VISIBILITY_TIMEOUT" in output
    assert (
        "knowledge.tasks.kb_reembed may run 3700 s, "
        "not less than the broker's visibility timeout of 3600 s" in output
    )
