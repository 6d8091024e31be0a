"""KB misses: noted in memory by requests, written in batches, grouped later in one pass."""

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from knowledge.miss_groups import misses_group
from knowledge.misses import miss_buffer_stats, miss_flush, miss_note
from knowledge.models import EmbeddingModel, Entry, Miss

pytestmark = pytest.mark.django_db

NEAR = (1.0, 0.0, 0.0, 0.0)
NEARER = (0.99, 0.1, 0.0, 0.0)  # cosine with NEAR about 0.995
FAR = (0.0, 0.0, 1.0, 0.0)


@pytest.fixture(autouse=True)
def _buffer_in_the_test_thread(settings):
    """The background flusher would write outside the test's transaction: keep it idle, and
    write what a test left in its own transaction, so nothing reaches a later test."""
    settings.KB_RECORD_MISSES = True
    settings.KB_MISS_FLUSH_SECONDS = 3600
    settings.KB_MISS_FLUSH_ROWS = 1000
    settings.KB_MISS_BUFFER_ROWS = 1000
    yield
    miss_flush()


@pytest.fixture
def model():
    return EmbeddingModel.objects.create(
        name="tiny", backend="local", dimensions=4, state=EmbeddingModel.State.SERVING
    )


def note(question, *, vector=None, model=None, answer="An answer.", entry=None, score=None):
    miss_note(
        question=question,
        answer=answer,
        best_entry_id=entry.pk if entry else None,
        best_score=score,
        model_id=model.pk if model else None,
        vector=vector,
    )


def test_noted_misses_become_rows_in_one_insert_when_flushed(model):
    entry = Entry.objects.create(question="How do I cancel my order?", answer="Open Orders.")
    note(
        "  Can I CANCEL a gift card?  ",
        vector=NEAR,
        model=model,
        entry=entry,
        score=0.61,
        answer="Yes, within 14 days.",
    )
    note("What is your phone number?", answer="+1 555 0100")
    assert not Miss.objects.exists()  # nothing is written while the request runs

    flushed_at = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        assert miss_flush() == 2
    assert len(queries) == 1 and queries[0]["sql"].lstrip().startswith("INSERT INTO knowledge_miss")

    first, second = Miss.objects.order_by("id")
    assert (first.question, first.normalized, first.answer) == (
        "Can I CANCEL a gift card?",
        "can i cancel a gift card",
        "Yes, within 14 days.",
    )
    assert (first.best_entry, first.best_score, first.count, first.grouped_at) == (
        entry,
        0.61,
        1,
        None,
    )
    assert (
        first.created_at <= second.created_at < flushed_at
    )  # when the request noted it, not when written
    # The vector the request passed, with its model: no embedding ran for the miss.
    assert first.model == model and list(first.embedding) == list(NEAR)
    assert (second.model, second.embedding, second.best_entry) == (None, None, None)
    assert miss_flush() == 0


def test_nothing_is_noted_when_recording_misses_is_off(settings):
    settings.KB_RECORD_MISSES = False
    note("Do you sell gift cards?")
    assert miss_buffer_stats().buffered == 0
    assert miss_flush() == 0


def test_a_full_buffer_drops_the_oldest_misses_and_counts_them(settings):
    settings.KB_MISS_BUFFER_ROWS = 3
    before = miss_buffer_stats()
    for i in range(5):
        note(f"question {i}")
    stats = miss_buffer_stats()
    assert stats.buffered == 3 and stats.dropped == before.dropped + 2
    miss_flush()
    assert list(Miss.objects.order_by("id").values_list("question", flat=True)) == [
        "question 2",
        "question 3",
        "question 4",
    ]
    assert miss_buffer_stats().written == before.written + 3


def test_a_batch_survives_a_deleted_entry_or_model_and_a_nul_character(model):
    gone = Entry.objects.create(question="Old entry?", answer="Old.")
    note("Is the old entry back?", entry=gone, score=0.5, vector=NEAR, model=model)
    note("A question with a \x00 inside")
    gone.delete()
    model.delete()
    assert miss_flush() == 2
    kept = Miss.objects.get(question="Is the old entry back?")
    assert (kept.best_entry, kept.best_score, kept.model, kept.embedding) == (None, 0.5, None, None)
    assert Miss.objects.filter(question="A question with a  inside").exists()


def heads():
    return {
        m.question: m.count
        for m in Miss.objects.filter(group__isnull=True, grouped_at__isnull=False)
    }


def test_grouping_joins_the_same_question_and_near_vectors_and_leaves_distant_ones_alone(model):
    other = EmbeddingModel.objects.create(name="other", backend="local", dimensions=4)
    note("Do you have gift cards?", vector=NEAR, model=model)
    note("do you have GIFT cards", vector=None)  # the same normalized question, no vector
    note("Can I buy a gift card?", vector=NEARER, model=model)
    note("What is your phone number?", vector=FAR, model=model)
    note(
        "Gift cards, from the other model?", vector=NEAR, model=other
    )  # vectors of two models never compare
    miss_flush()

    assert misses_group() == 5
    assert heads() == {
        "Do you have gift cards?": 3,
        "What is your phone number?": 1,
        "Gift cards, from the other model?": 1,
    }
    assert not Miss.objects.filter(grouped_at__isnull=True).exists()

    # Later misses join the groups already there.
    note("DO YOU HAVE GIFT CARDS?!")
    note("Gift card prices?", vector=NEARER, model=model)
    note("Where is your office?", vector=(0.0, 0.0, 0.0, 1.0), model=model)
    miss_flush()
    assert misses_group() == 3
    assert heads() == {
        "Do you have gift cards?": 5,
        "What is your phone number?": 1,
        "Gift cards, from the other model?": 1,
        "Where is your office?": 1,
    }
    head = Miss.objects.get(question="Do you have gift cards?")
    assert set(head.members.values_list("question", flat=True)) == {
        "do you have GIFT cards",
        "Can I buy a gift card?",
        "DO YOU HAVE GIFT CARDS?!",
        "Gift card prices?",
    }


def test_grouping_twice_changes_nothing(model):
    note("Do you have gift cards?", vector=NEAR, model=model)
    note("Can I buy a gift card?", vector=NEARER, model=model)
    miss_flush()
    misses_group()
    before = list(Miss.objects.order_by("id").values_list("id", "group_id", "count", "grouped_at"))
    assert misses_group() == 0
    assert (
        list(Miss.objects.order_by("id").values_list("id", "group_id", "count", "grouped_at"))
        == before
    )


def test_a_resolved_group_takes_no_new_members(model):
    note("Do you have gift cards?", vector=NEAR, model=model)
    miss_flush()
    misses_group()
    entry = Entry.objects.create(question="Do you have gift cards?", answer="Yes.")
    Miss.objects.update(resolved_by=entry)
    note("do you have gift cards", vector=NEARER, model=model)
    miss_flush()
    misses_group()
    assert (
        Miss.objects.get(question="do you have gift cards").group is None
    )  # a new group of its own


def test_a_pass_stops_at_its_limit_and_the_next_one_goes_on(model):
    for i in range(5):
        note(f"Question number {i}?", vector=NEAR, model=model)
    miss_flush()
    assert misses_group(limit=2) == 2
    assert Miss.objects.filter(grouped_at__isnull=True).count() == 3
    assert misses_group(limit=10) == 3
    assert heads() == {"Question number 0?": 5}


@pytest.mark.django_db(transaction=True)
def test_two_passes_at_once_place_each_miss_once(model):
    for i in range(40):
        note(f"Do you have gift cards, {i}?", vector=NEAR if i % 2 else NEARER, model=model)
        note(f"phone number {i % 3}", vector=FAR, model=model)
    miss_flush()
    placed, start = [], threading.Barrier(2)

    def run():
        try:
            start.wait()
            placed.append(misses_group())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(placed) == [0, 80]  # the second pass waited for the first and found nothing left
    assert heads() == {"Do you have gift cards, 0?": 40, "phone number 0": 40}


@pytest.mark.django_db(transaction=True)
def test_the_flusher_thread_writes_by_itself(settings, model):
    import time

    settings.KB_MISS_FLUSH_SECONDS = 0.2
    note("Do you ship to Norway?", vector=FAR, model=model)
    deadline = time.monotonic() + 30
    while not Miss.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    miss = Miss.objects.get()
    assert miss.question == "Do you ship to Norway?" and miss.model == model


@pytest.mark.django_db(transaction=True)
def test_the_beat_task_groups_misses_on_the_worker(celery_worker, settings, model):
    from config.celery import app

    note("Do you have gift cards?", vector=NEAR, model=model)
    note("Can I buy a gift card?", vector=NEARER, model=model)
    miss_flush()
    scheduled = settings.CELERY_BEAT_SCHEDULE["group-kb-misses"]
    assert scheduled["schedule"] == 60.0
    assert app.send_task(scheduled["task"]).get(timeout=60) == 2
    assert heads() == {"Do you have gift cards?": 2}
    assert app.send_task(scheduled["task"]).get(timeout=60) == 0


def test_a_batch_written_again_after_a_lost_connection_stores_each_miss_once():
    """The INSERT commits, then the connection drops before its answer: the writer puts the batch
    back and writes it again. Each miss is stored once."""
    from django.db import OperationalError

    def committed_then_lost(execute, sql, params, many, context):
        execute(sql, params, many, context)
        raise OperationalError("server closed the connection unexpectedly")

    note("Do you ship to Mars?")
    note("Do you ship to the Moon?")
    with connection.execute_wrapper(committed_then_lost), pytest.raises(OperationalError):
        miss_flush()
    assert miss_buffer_stats().buffered == 2  # back in the buffer, as after any lost database
    assert miss_flush() == 0
    assert sorted(Miss.objects.values_list("question", flat=True)) == [
        "Do you ship to Mars?",
        "Do you ship to the Moon?",
    ]
