"""API keys in the admin: listed for staff who may view them, revoked by those who may change
them, and otherwise immutable: a revoked key never comes back, and a key keeps its name."""

import pytest

from chat.apikeys import apikey_authenticate, apikey_create, apikey_revoke
from chat.models import ApiKey
from tests.support.personas import NO_DELETE, VIEW_ONLY, client_of, shown_messages, staff_user

pytestmark = pytest.mark.django_db


def test_a_view_only_staff_user_cannot_revoke_another_users_key(alice):
    key, raw = apikey_create(user=alice, name="laptop", scopes=["chat"])
    viewer = client_of(staff_user("viewer", verbs=VIEW_ONLY))
    page = viewer.get("/admin/chat/apikey/").content.decode()
    assert "laptop" in page and "Revoke selected keys" not in page
    response = viewer.post(
        "/admin/chat/apikey/", {"action": "revoke", "_selected_action": [key.pk]}
    )
    assert response.status_code == 200 and shown_messages(response) == []
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    assert apikey_authenticate(raw=raw) is not None


def test_staff_who_may_change_keys_revoke_one_and_it_stops_working(alice):
    key, raw = apikey_create(user=alice, name="laptop", scopes=["chat"])
    assert apikey_authenticate(raw=raw) is not None
    curator = client_of(staff_user("keeper", verbs=NO_DELETE))
    response = curator.post(
        "/admin/chat/apikey/", {"action": "revoke", "_selected_action": [key.pk]}
    )
    assert shown_messages(response) == ["1 key(s) revoked."]
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert apikey_authenticate(raw=raw) is None


def test_a_revoked_key_cannot_be_brought_back_or_renamed_from_the_change_form(alice, admin_client):
    key, raw = apikey_create(user=alice, name="laptop", scopes=["chat"])
    apikey_revoke(key=key)
    revoked_at = ApiKey.objects.get(pk=key.pk).revoked_at
    page = admin_client.get(f"/admin/chat/apikey/{key.pk}/change/").content.decode()
    assert (
        'name="_save"' not in page and 'name="name"' not in page and 'name="revoked_at' not in page
    )

    response = admin_client.post(
        f"/admin/chat/apikey/{key.pk}/change/",
        {
            "name": "other client",
            "revoked_at_0": "",
            "revoked_at_1": "",
            "user": alice.pk,
            "scopes": "chat,kb",
        },
    )
    assert response.status_code == 403
    key.refresh_from_db()
    assert (key.name, key.revoked_at, key.scopes) == ("laptop", revoked_at, ["chat"])
    assert apikey_authenticate(raw=raw) is None


# --- the client name: what routing rules know a key by, staff's to give ---------------------------


def test_staff_who_may_change_keys_give_one_a_client_name_and_change_nothing_else(alice):
    key, raw = apikey_create(user=alice, name="laptop", scopes=["chat"])
    assert apikey_authenticate(raw=raw).client == "api"  # no client name: no rule lists it
    curator = client_of(staff_user("keeper", verbs=NO_DELETE))
    page = curator.get(f"/admin/chat/apikey/{key.pk}/change/").content.decode()
    assert 'name="client_name"' in page and 'name="name"' not in page

    response = curator.post(
        f"/admin/chat/apikey/{key.pk}/change/",
        {"client_name": "acme", "name": "other", "scopes": "chat,kb", "user": alice.pk},
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert (key.client_name, key.name, key.scopes, key.user) == ("acme", "laptop", ["chat"], alice)
    assert apikey_authenticate(raw=raw).client == "client:acme"


def test_a_view_only_staff_user_cannot_give_a_key_a_client_name(alice):
    key, _ = apikey_create(user=alice, name="laptop", scopes=["chat"])
    viewer = client_of(staff_user("viewer", verbs=VIEW_ONLY))
    page = viewer.get(f"/admin/chat/apikey/{key.pk}/change/").content.decode()
    assert 'name="client_name"' not in page
    response = viewer.post(f"/admin/chat/apikey/{key.pk}/change/", {"client_name": "acme"})
    assert response.status_code == 403
    assert ApiKey.objects.get(pk=key.pk).client_name == ""


def test_a_revoked_key_gets_no_client_name(alice, admin_client):
    key, _ = apikey_create(user=alice, name="laptop", scopes=["chat"])
    apikey_revoke(key=key)
    response = admin_client.post(f"/admin/chat/apikey/{key.pk}/change/", {"client_name": "acme"})
    assert response.status_code == 403
    assert ApiKey.objects.get(pk=key.pk).client_name == ""


def test_a_client_name_with_control_characters_is_refused_with_a_message(alice, admin_client):
    key, _ = apikey_create(user=alice, name="laptop", scopes=["chat"])
    response = admin_client.post(
        f"/admin/chat/apikey/{key.pk}/change/", {"client_name": "acme\u0007bell"}
    )
    assert response.status_code == 200
    assert "The client name must not start or end with spaces or hold control characters." in (
        response.content.decode()
    )
    assert ApiKey.objects.get(pk=key.pk).client_name == ""
