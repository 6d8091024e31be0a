"""The KB API maps the entry model's permissions as the admin does: reading, searching and
answering need view, creating add, editing change, deleting delete; a key needs the `kb` scope
and carries its user's permissions."""

import pytest
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from knowledge.models import Entry
from knowledge.services.entries import entry_create
from tests.support.personas import EVERY_VERB, NO_DELETE, VIEW_ONLY, staff_user

pytestmark = pytest.mark.django_db

NEW = {"question": "What is the refund policy?", "answer": "Refunds are wired to this account."}


@pytest.fixture
def entry():
    return entry_create(question="Do you ship to Chile?", answer="Yes.", embed="none")


def api_of(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def statuses(client, entry) -> dict[str, int]:
    url = f"/api/kb/entries/{entry.pk}/"
    return {
        "list": client.get("/api/kb/entries/").status_code,
        "read": client.get(url).status_code,
        "search": client.get("/api/kb/search", {"q": "ship to Chile"}).status_code,
        "answer": client.get("/api/kb/answer", {"q": "ship to Chile"}).status_code,
        "create": client.post("/api/kb/entries/", NEW, format="json").status_code,
        "edit": client.patch(url, {"tags": ["shipping"]}, format="json").status_code,
        "replace": client.put(
            url, {"question": "Do you ship to Chile?", "answer": "Yes."}, format="json"
        ).status_code,
        "delete": client.delete(url).status_code,
    }


def test_staff_without_permissions_cannot_create_an_entry_through_the_api():
    response = api_of(staff_user("bare")).post("/api/kb/entries/", NEW, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "This needs the knowledge.add_entry permission."
    assert not Entry.objects.exists()


def test_staff_without_permissions_reach_nothing_of_the_kb_api(entry):
    assert set(statuses(api_of(staff_user("bare")), entry).values()) == {403}
    assert Entry.objects.get(pk=entry.pk).tags == []


def test_a_view_only_curator_reads_and_searches_but_cannot_write(entry):
    assert statuses(api_of(staff_user("viewer", verbs=VIEW_ONLY)), entry) == {
        "list": 200,
        "read": 200,
        "search": 200,
        "answer": 200,
        "create": 403,
        "edit": 403,
        "replace": 403,
        "delete": 403,
    }
    assert Entry.objects.count() == 1 and Entry.objects.get(pk=entry.pk).tags == []


def test_a_curator_without_delete_edits_but_cannot_delete(entry):
    assert statuses(api_of(staff_user("editor", verbs=NO_DELETE)), entry) == {
        "list": 200,
        "read": 200,
        "search": 200,
        "answer": 200,
        "create": 201,
        "edit": 200,
        "replace": 200,
        "delete": 403,
    }
    assert Entry.objects.filter(pk=entry.pk).exists()


def test_a_curator_with_every_permission_deletes(entry):
    assert (
        api_of(staff_user("curator", verbs=EVERY_VERB))
        .delete(f"/api/kb/entries/{entry.pk}/")
        .status_code
        == 204
    )


def test_a_kb_key_carries_its_users_permissions_and_a_chat_key_reaches_nothing(entry):
    viewer = staff_user("viewer", verbs=VIEW_ONLY)
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {apikey_create(user=viewer, name='curation', scopes=['kb'])[1]}"
    )
    assert client.get("/api/kb/entries/").status_code == 200
    response = client.post("/api/kb/entries/", NEW, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "This needs the knowledge.add_entry permission."

    curator = staff_user("curator", verbs=EVERY_VERB)
    _, key = apikey_create(user=curator, name="laptop", scopes=["chat"])
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = client.get("/api/kb/entries/")
    assert (
        response.status_code == 403
        and response.json()["error"]["message"] == "This API key lacks the kb scope."
    )
