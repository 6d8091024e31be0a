"""Entries awaiting review (made from users' questions) are served by no path until a curator
activates them, and activating one is its review."""

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from knowledge.exceptions import EntryInvalid
from knowledge.miss_groups import miss_to_entry
from knowledge.models import Entry, Miss
from knowledge.selectors import direct_answer
from knowledge.services.entries import entries_set_active, entry_create
from tests.support.personas import NO_DELETE, staff_user

pytestmark = pytest.mark.django_db


def awaiting(question="Do you sell gift cards?"):
    return entry_create(
        question=question, answer="Yes.", active=False, needs_review=True, embed="none"
    )


def test_an_entry_awaiting_review_cannot_be_created_active():
    with pytest.raises(EntryInvalid, match="inactive until a curator activates it"):
        entry_create(
            question="Do you sell gift cards?", answer="Yes.", needs_review=True, embed="none"
        )


def test_no_write_can_serve_an_entry_awaiting_review_without_reviewing_it():
    entry = awaiting()
    with pytest.raises(IntegrityError), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).update(active=True)
    assert not direct_answer("Do you sell gift cards?").hit


def test_activating_it_in_the_kb_api_reviews_it(admin_user):
    entry = awaiting()
    api = APIClient()
    api.force_authenticate(admin_user)
    assert (
        api.patch(
            f"/api/kb/entries/{entry.pk}/", {"answer": "Yes, from 10 euros."}, format="json"
        ).status_code
        == 200
    )
    entry.refresh_from_db()
    assert (entry.active, entry.needs_review) == (False, True)  # edited, still waiting
    assert (
        api.patch(f"/api/kb/entries/{entry.pk}/", {"active": True}, format="json").status_code
        == 200
    )
    entry.refresh_from_db()
    assert (entry.active, entry.needs_review) == (True, False) and entry.reviewed_at is not None
    assert direct_answer("Do you sell gift cards?").entry == entry


def test_activating_in_bulk_reviews_only_those_awaiting_review():
    waiting, curated = (
        awaiting(),
        entry_create(question="Opening hours?", answer="9 to 5.", active=False, embed="none"),
    )
    assert entries_set_active(ids=[waiting.pk, curated.pk], active=True) == 2
    waiting.refresh_from_db()
    curated.refresh_from_db()
    assert (waiting.active, waiting.needs_review) == (
        True,
        False,
    ) and waiting.reviewed_at is not None
    assert (curated.active, curated.needs_review, curated.reviewed_at) == (True, False, None)


def _made_from_a_miss(
    question="Do you sell gift cards?", answer="Yes, from 10 to 200 euros."
) -> Entry:
    miss = Miss.objects.create(
        question=question,
        normalized=question.lower(),
        answer=answer,
        count=3,
        grouped_at=timezone.now(),
    )
    return miss_to_entry(miss=miss)


def test_the_kb_api_shows_an_entry_made_from_a_miss_as_inactive_and_awaiting_review():
    entry = _made_from_a_miss()
    api = APIClient()
    api.force_authenticate(staff_user("editor", verbs=NO_DELETE))
    body = api.get(f"/api/kb/entries/{entry.pk}/").json()
    assert (body["active"], body["needs_review"], body["reviewed_at"]) == (False, True, None)

    # The review state is the curators' to change by activating, not a field a client writes.
    response = api.patch(
        f"/api/kb/entries/{entry.pk}/",
        {"needs_review": False, "reviewed_at": "2020-01-01T00:00:00Z"},
        format="json",
    )
    assert response.status_code == 200
    assert (response.json()["needs_review"], response.json()["reviewed_at"]) == (True, None)

    body = api.patch(f"/api/kb/entries/{entry.pk}/", {"active": True}, format="json").json()
    assert (body["active"], body["needs_review"]) == (True, False) and body[
        "reviewed_at"
    ] is not None


def test_the_entry_list_in_the_admin_shows_which_entries_await_review():
    waiting = _made_from_a_miss()
    curated = entry_create(question="Opening hours?", answer="9 to 5.", embed="none")
    curator = Client()
    curator.force_login(staff_user("editor", verbs=NO_DELETE))
    page = curator.get("/admin/knowledge/entry/").content.decode()
    assert "awaiting review" in page  # the column's heading
    rows = {entry.pk: _row_of(page, entry.pk) for entry in (waiting, curated)}
    assert (
        'alt="True"' in rows[waiting.pk].split('class="field-awaiting_review"')[1].split("</td>")[0]
    )
    assert (
        'alt="False"'
        in rows[curated.pk].split('class="field-awaiting_review"')[1].split("</td>")[0]
    )


def _row_of(page: str, pk: int) -> str:
    """The list's row for one entry (the row holds its checkbox, value="pk")."""
    start = page.index(f'value="{pk}"')
    return page[start : page.index("</tr>", start)]
