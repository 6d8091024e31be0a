"""Entries awaiting review (made from users' questions) are served by no path until a curator
activates them, and activating one is its review."""

import pytest
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from knowledge.exceptions import EntryInvalid
from knowledge.models import Entry
from knowledge.selectors import direct_answer
from knowledge.services import entries_set_active, entry_create

pytestmark = pytest.mark.django_db


def awaiting(question="Do you sell gift cards?"):
    return entry_create(question=question, answer="Yes.", active=False, needs_review=True, embed="none")


def test_an_entry_awaiting_review_cannot_be_created_active():
    with pytest.raises(EntryInvalid, match="inactive until a curator activates it"):
        entry_create(question="Do you sell gift cards?", answer="Yes.", needs_review=True, embed="none")


def test_no_write_can_serve_an_entry_awaiting_review_without_reviewing_it():
    entry = awaiting()
    with pytest.raises(IntegrityError), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).update(active=True)
    assert not direct_answer("Do you sell gift cards?").hit


def test_activating_it_in_the_kb_api_reviews_it(admin_user):
    entry = awaiting()
    api = APIClient()
    api.force_authenticate(admin_user)
    assert api.patch(f"/api/kb/entries/{entry.pk}/", {"answer": "Yes, from 10 euros."}, format="json").status_code == 200
    entry.refresh_from_db()
    assert (entry.active, entry.needs_review) == (False, True)  # edited, still waiting
    assert api.patch(f"/api/kb/entries/{entry.pk}/", {"active": True}, format="json").status_code == 200
    entry.refresh_from_db()
    assert (entry.active, entry.needs_review) == (True, False) and entry.reviewed_at is not None
    assert direct_answer("Do you sell gift cards?").entry == entry


def test_activating_in_bulk_reviews_only_those_awaiting_review():
    waiting, curated = awaiting(), entry_create(question="Opening hours?", answer="9 to 5.", active=False,
                                               embed="none")
    assert entries_set_active(ids=[waiting.pk, curated.pk], active=True) == 2
    waiting.refresh_from_db()
    curated.refresh_from_db()
    assert (waiting.active, waiting.needs_review) == (True, False) and waiting.reviewed_at is not None
    assert (curated.active, curated.needs_review, curated.reviewed_at) == (True, False, None)
