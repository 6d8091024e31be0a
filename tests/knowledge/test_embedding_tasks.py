import time

import pytest

from knowledge.models import PassageVector, PhrasingVector
from knowledge.selectors import direct_answer
from knowledge.services.entries import entry_create, entry_update
from knowledge.services.vectors import entry_embed


def _wait_for(condition, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.django_db(transaction=True)
def test_a_new_entry_is_embedded_by_a_worker_after_commit_and_then_answers(
    celery_worker, vector_point
):
    entry = entry_create(
        question="Do you ship to Iceland?", answer="Yes, twice a week."
    )  # embed="async"
    # Committed, but no vector yet: exact match works at once, a paraphrase cannot hit.
    assert direct_answer("do you ship to iceland").hit

    assert _wait_for(lambda: PhrasingVector.objects.filter(phrasing__entry=entry).exists()), (
        "no worker embedded it"
    )
    assert PassageVector.objects.filter(passage__entry=entry).exists()
    entry_create(
        question="What payment methods do you accept?",
        answer="Cards and bank transfer.",
        embed="sync",
    )
    result = direct_answer("do you also ship to iceland?")
    assert result.hit and result.method == "vector" and result.entry == entry


@pytest.mark.django_db
def test_a_task_for_a_since_edited_entry_does_nothing(db):
    entry = entry_create(question="Old wording?", answer="Old answer.", embed="none")
    old_version = entry.version
    entry = entry_update(entry=entry, question="New wording?", embed="none")
    assert entry_embed(entry_id=entry.pk, version=old_version) is False
    assert not PhrasingVector.objects.filter(phrasing__entry=entry).exists()
    assert entry_embed(entry_id=entry.pk, version=entry.version) is True
    # Running it twice is harmless.
    assert entry_embed(entry_id=entry.pk, version=entry.version) is True
    assert PhrasingVector.objects.filter(phrasing__entry=entry).count() == 1


@pytest.mark.django_db
def test_a_task_for_a_deleted_entry_does_nothing(db):
    entry = entry_create(question="Short-lived?", answer="Yes.", embed="none")
    entry_id, version = entry.pk, entry.version
    entry.delete()
    assert entry_embed(entry_id=entry_id, version=version) is False


@pytest.mark.django_db
def test_changing_only_tags_or_the_active_flag_keeps_the_vectors(db):
    entry = entry_create(question="Is there a student discount?", answer="Yes, 20%.", embed="sync")
    version = entry.version
    entry = entry_update(entry=entry, tags=["pricing"], active=True)
    assert entry.version == version
    assert PhrasingVector.objects.filter(phrasing__entry=entry).exists()
