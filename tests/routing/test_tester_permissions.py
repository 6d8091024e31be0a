"""The route tester (admin) and the explainer (API) show every rule's conditions, the KB's
matches and the endpoints' failures: they are for staff who may view the routing rules."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from tests.support.factories import endpoint, rule
from tests.support.personas import staff_user

pytestmark = pytest.mark.django_db

VIEW_RULES = ("routing.view_routingrule",)


@pytest.fixture
def rules(local_sim):
    rule("vip", endpoint("local", local_sim), keywords=["invoice"], priority=10)


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_of(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_staff_without_the_routing_view_permission_cannot_open_the_route_tester(rules, alice):
    staff = client_of(staff_user("kb-only", perms=("knowledge.view_entry",)))
    response = staff.get(
        "/admin/routing/routingrule/tester/", {"text": "my invoice", "user": "alice"}
    )
    assert response.status_code == 403
    assert "invoice" not in response.content.decode()


def test_the_route_tester_opens_for_staff_who_may_view_rules_and_lists_no_usernames(
    rules, alice, bob
):
    viewer = client_of(staff_user("rules-viewer", perms=VIEW_RULES))
    page = viewer.get("/admin/routing/routingrule/tester/").content.decode()
    assert "alice" not in page and "bob" not in page

    html = viewer.get(
        "/admin/routing/routingrule/tester/", {"text": "my invoice", "user": "alice"}
    ).content.decode()
    assert "Decision: local (rule vip)" in html
    html = viewer.get(
        "/admin/routing/routingrule/tester/", {"text": "my invoice", "user": "nobody"}
    ).content.decode()
    assert "There is no user with this username." in html


def test_staff_without_the_routing_view_permission_cannot_explain_a_route(rules):
    response = api_of(staff_user("bare")).post(
        "/api/routing/explain", {"text": "my invoice"}, format="json"
    )
    assert response.status_code == 403
    assert (
        response.json()["error"]["message"] == "This needs the routing.view_routingrule permission."
    )


def test_staff_who_may_view_rules_explain_a_route_by_session_or_kb_key(rules):
    viewer = staff_user("rules-viewer", perms=VIEW_RULES)
    response = api_of(viewer).post("/api/routing/explain", {"text": "my invoice"}, format="json")
    assert response.status_code == 200 and response.json()["decision"]["rule"] == "vip"

    kb_key = apikey_create(user=viewer, name="curation", scopes=["kb"])[1]
    chat_key = apikey_create(user=viewer, name="laptop", scopes=["chat"])[1]
    by_key = APIClient()
    by_key.credentials(HTTP_AUTHORIZATION=f"Bearer {kb_key}")
    assert (
        by_key.post("/api/routing/explain", {"text": "my invoice"}, format="json").status_code
        == 200
    )
    by_key.credentials(HTTP_AUTHORIZATION=f"Bearer {chat_key}")
    response = by_key.post("/api/routing/explain", {"text": "my invoice"}, format="json")
    assert (
        response.status_code == 403
        and response.json()["error"]["message"] == "This API key lacks the kb scope."
    )
