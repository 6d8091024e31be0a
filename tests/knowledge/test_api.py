import pytest
from rest_framework.test import APIClient

from knowledge.models import Entry

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    client = APIClient()
    client.force_authenticate(
        django_user_model.objects.create_user("user", password="pw-123456789")
    )
    return client


def test_staff_create_read_update_and_delete_entries(staff, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = staff.post(
            "/api/kb/entries/",
            {
                "question": "Do you ship to Chile?",
                "answer": "Yes.",
                "aliases": ["delivery to Chile"],
                "tags": ["Shipping"],
            },
            format="json",
        )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "faq" and body["tags"] == ["shipping"] and body["version"] == 1
    assert len(callbacks) == 1

    entry_url = f"/api/kb/entries/{body['id']}/"
    assert staff.get(entry_url).json()["question"] == "Do you ship to Chile?"
    response = staff.patch(entry_url, {"answer": "Yes, in 10 days."}, format="json")
    assert response.status_code == 200 and response.json()["version"] == 2
    listing = staff.get("/api/kb/entries/", {"tag": "shipping"}).json()
    assert listing["count"] == 1 and listing["results"][0]["answer"] == "Yes, in 10 days."
    assert staff.delete(entry_url).status_code == 204
    assert staff.get(entry_url).status_code == 404


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"question": "Q?", "answer": "  "}, "answer"),
        ({"question": "", "answer": "A"}, "question"),
        ({"question": "Q?", "answer": "A", "kind": "poem"}, "kind"),
        ({"question": "Q?", "answer": "A", "threshold": 1.5}, "threshold"),
        ({"question": "Q?", "answer": "A", "aliases": "not a list"}, "aliases"),
    ],
)
def test_invalid_entries_are_400_naming_the_field_and_nothing_is_written(staff, payload, field):
    response = staff.post("/api/kb/entries/", payload, format="json")
    assert response.status_code == 400
    body = response.json()
    assert field in body or field in body.get("error", {}).get("fields", {}), body
    assert not Entry.objects.exists()


def test_search_returns_matches_scores_and_the_direct_answer_verdict(staff, kb, vector_point):
    body = staff.get("/api/kb/search", {"q": "how can I cancel an order I placed"}).json()
    assert body["direct"]["hit"] is True and body["direct"]["method"] == "vector"
    assert body["direct"]["entry"]["question"] == "How do I cancel my order?"
    assert body["direct"]["runner_up"]["question"] == "How do I cancel my subscription?"
    assert body["direct"]["margin"] > 0.05
    assert body["matches"][0]["score"] >= body["matches"][1]["score"]

    body = staff.get("/api/kb/search", {"q": "When do I get my money back?"}).json()
    assert body["direct"]["hit"] is False
    assert body["context"][0]["label"] == f"KB#{kb['refund'].pk}: Refund policy"


def test_answer_returns_the_stored_answer_or_a_miss(staff, kb):
    body = staff.get("/api/kb/answer", {"q": "HOW DO I CANCEL MY ORDER"}).json()
    assert body["hit"] is True and body["method"] == "exact"
    assert body["answer"] == kb["How do I cancel my order?"].answer
    body = staff.get("/api/kb/answer", {"q": "what is the weather today"}).json()
    assert body["hit"] is False and body["answer"] is None and "threshold" in body["reason"]


def test_search_rejects_an_empty_or_oversized_query(staff):
    assert staff.get("/api/kb/search", {"q": "   "}).status_code == 400
    assert staff.get("/api/kb/search", {"q": "x" * 2001}).status_code == 400
    assert staff.get("/api/kb/search", {"q": "x", "k": 0}).status_code == 400


def test_users_without_kb_access_are_refused(user, client, kb):
    assert user.get("/api/kb/search", {"q": "cancel"}).status_code == 403
    assert (
        user.post("/api/kb/entries/", {"question": "Q?", "answer": "A"}, format="json").status_code
        == 403
    )
    assert client.get("/api/kb/entries/").status_code == 401


def test_the_kb_api_is_in_the_openapi_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert {"/api/kb/entries/", "/api/kb/entries/{id}/", "/api/kb/search", "/api/kb/answer"} <= set(
        schema["paths"]
    )
