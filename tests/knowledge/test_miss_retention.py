"""KB misses, direct answers and verdicts hold what users asked, what they were told and what they
thought of it: they are kept no longer than the request log, and a turn that stores nothing (a /v1
call naming no session) leaves none of them either."""

import json
import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone

from chat.models import ChatSession
from chat.openai_api.handlers import chat_completions
from knowledge.hits import hit_flush
from knowledge.miss_groups import misses_group
from knowledge.misses import miss_flush
from knowledge.models import EmbeddingModel, Entry, Feedback, Hit, Miss
from tests.knowledge.test_misses import FAR, NEAR, NEARER, heads, note
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _misses_recorded_in_the_test_thread(settings):
    settings.KB_RECORD_MISSES = True
    settings.KB_MISS_FLUSH_SECONDS = 3600  # the writer thread stays idle: the test flushes
    yield
    miss_flush()
    hit_flush()


@pytest.fixture
def model():
    return EmbeddingModel.objects.create(
        name="tiny", backend="local", dimensions=4, state=EmbeddingModel.State.SERVING
    )


def aged(question: str, days: float) -> None:
    Miss.objects.filter(question=question).update(
        created_at=timezone.now() - timezone.timedelta(days=days)
    )


def test_misses_past_the_request_logs_retention_go_with_its_scheduled_prune_and_groups_stay_whole(
    settings, model
):
    from config.celery import app

    settings.REQUEST_LOG_DAYS = 30
    note("Do you have gift cards?", vector=NEAR, model=model)
    note("do you have GIFT cards")
    note("Can I buy a gift card?", vector=NEARER, model=model)
    note("Gift card prices?", vector=NEARER, model=model)
    note("What is your phone number?", vector=FAR, model=model)
    note("what is your phone number")
    miss_flush()
    misses_group()
    note("Where is your office?")  # waiting for the grouping pass
    note("Do you deliver on Sundays?")
    miss_flush()
    assert heads() == {"Do you have gift cards?": 4, "What is your phone number?": 2}
    for question, days in [
        ("Do you have gift cards?", 45),
        ("do you have GIFT cards", 40),
        ("Can I buy a gift card?", 2),
        ("what is your phone number", 31),
        ("Where is your office?", 60),
    ]:
        aged(question, days)

    # The request log's retention task, as the beat schedules it, prunes the misses too.
    scheduled = settings.CELERY_BEAT_SCHEDULE["prune-request-log"]
    app.loader.import_default_modules()  # the apps' tasks, as a worker registers them
    app.tasks[scheduled["task"]].apply().get()

    assert sorted(Miss.objects.values_list("question", flat=True)) == [
        "Can I buy a gift card?",
        "Do you deliver on Sundays?",
        "Gift card prices?",
        "What is your phone number?",
    ]
    # A group whose first miss expired is headed by its oldest remaining one; counts are what is
    # left.
    assert heads() == {"Can I buy a gift card?": 2, "What is your phone number?": 1}
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no miss points at a deleted group
    # And the groups go on taking new misses.
    note("GIFT CARD PRICES?!", vector=NEAR, model=model)
    miss_flush()
    misses_group()
    assert heads() == {
        "Can I buy a gift card?": 3,
        "What is your phone number?": 1,
        "Do you deliver on Sundays?": 1,
    }


def v1_ask(key: str, question: str, *, session: int | None = None):
    headers = {"authorization": f"Bearer {key}"}
    if session is not None:
        headers["x-session-id"] = str(session)
    body = json.dumps(
        {"model": "auto", "max_tokens": 3, "messages": [{"role": "user", "content": question}]}
    )
    return async_to_sync(chat_completions)(headers, body.encode(), time.monotonic())


def test_a_v1_call_that_stores_nothing_leaves_no_kb_miss_and_one_naming_its_session_does(
    local_sim, alice, alice_key
):
    rule("default", endpoint("local", local_sim), is_default=True, use_kb_context=False)
    unstored = v1_ask(alice_key, "Do you ship gift cards to Iceland?")
    assert unstored.status == 200 and unstored.body["choices"][0]["message"]["content"]
    assert not ChatSession.objects.exists()

    session = ChatSession.objects.create(user=alice)
    stored = v1_ask(alice_key, "Do you ship gift cards to Greenland?", session=session.pk)
    assert stored.status == 200 and session.messages.count() == 2

    miss_flush()
    assert list(Miss.objects.values_list("question", flat=True)) == [
        "Do you ship gift cards to Greenland?"
    ]


def test_direct_answers_and_verdicts_past_the_retention_go_with_the_scheduled_prune(settings):
    from config.celery import app

    settings.REQUEST_LOG_DAYS = 30
    entry = Entry.objects.create(question="How do I cancel my order?", answer="Open Orders.")
    now = timezone.now()
    for question, days in [("old question", 31), ("new question", 2)]:
        hit = Hit.objects.create(
            question=question,
            normalized=question,
            entry=entry,
            method="exact",
            created_at=now - timezone.timedelta(days=days),
            key=uuid.uuid4(),
        )
        Feedback.objects.create(request_key=hit.key, verdict="down", interface="web")
        Feedback.objects.filter(request_key=hit.key).update(
            updated_at=now - timezone.timedelta(days=days)
        )
    app.loader.import_default_modules()
    app.tasks[settings.CELERY_BEAT_SCHEDULE["prune-request-log"]["task"]].apply().get()
    assert list(Hit.objects.values_list("question", flat=True)) == ["new question"]
    assert Feedback.objects.get().request_key == Hit.objects.get().key


def test_a_v1_call_that_stores_nothing_keeps_no_direct_answer_and_one_naming_its_session_does(
    settings, alice, alice_key, product
):
    settings.KB_RECORD_HITS = True
    assert v1_ask(alice_key, "How do I reset my password?").headers["X-Route"] == "kb"
    session = ChatSession.objects.create(user=alice)
    v1_ask(alice_key, "how do I reset my password", session=session.pk)
    hit_flush()
    hit = Hit.objects.get()
    assert hit.question == "how do I reset my password"
    assert session.messages.get(role="assistant").request_key == hit.key
