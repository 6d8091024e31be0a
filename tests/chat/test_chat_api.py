"""The DRF chat API and API keys: CRUD, sending (JSON and SSE), scopes, isolation, limits."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from chat.models import ApiKey, ChatSession, Message
from tests.support.personas import EVERY_VERB, staff_user
from tests.support.rate_window import one_rate_window

pytestmark = pytest.mark.django_db


def test_sessions_crud(api):
    created = api.post("/api/chat/sessions/", {"title": "Trip planning"}, format="json")
    assert created.status_code == 201
    sid = created.json()["id"]
    assert api.get("/api/chat/sessions/").json()["results"][0]["title"] == "Trip planning"
    assert (
        api.patch(f"/api/chat/sessions/{sid}/", {"title": "Holidays"}, format="json").json()[
            "title"
        ]
        == "Holidays"
    )
    assert (
        api.patch(f"/api/chat/sessions/{sid}/", {"title": "  "}, format="json").status_code == 400
    )
    assert api.delete(f"/api/chat/sessions/{sid}/").status_code == 204
    assert api.get(f"/api/chat/sessions/{sid}/").status_code == 404


def test_sending_a_message_returns_the_finished_turn(api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    response = api.post(
        f"/api/chat/sessions/{sid}/messages/",
        {"content": "How do I reset my password?"},
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    assert body["user_message"]["content"] == "How do I reset my password?"
    assert (
        body["assistant_message"]["status"] == "complete"
        and body["assistant_message"]["road"] == "kb"
    )
    messages = api.get(f"/api/chat/sessions/{sid}/messages/").json()["results"]
    assert [m["role"] for m in messages] == ["user", "assistant"]


@pytest.mark.django_db(transaction=True)
def test_the_streaming_variant_sends_server_sent_events(asgi_server, alice, alice_key, product):
    import urllib.request

    session = ChatSession.objects.create(user=alice)
    request = urllib.request.Request(
        f"{asgi_server}/api/chat/sessions/{session.pk}/messages/stream",
        method="POST",
        data=json.dumps(
            {"content": "Tell me a long story about the sea", "max_tokens": 4}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {alice_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = response.read().decode()
    events = [block.split("\n")[0].removeprefix("event: ") for block in text.strip().split("\n\n")]
    assert events[0] == "session" and events[1] == "route" and events[-1] == "done"
    # Tokens that arrive in one network read leave as one event: count them by the usage.
    assert 1 <= events.count("token") <= 4 and set(events[2:-1]) == {"token"}
    done = json.loads(text.strip().split("\n\n")[-1].split("data: ", 1)[1])
    assert done["usage"]["completion_tokens"] == 4
    assert Message.objects.get(session=session, role="assistant").status == "complete"


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"content": ""}, 400),
        ({"content": "   "}, 400),
        ({}, 400),
        ({"content": 42}, 400),
        ({"content": "hi", "max_tokens": -5}, 400),
        ({"content": "x" * 20000}, 413),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_stored(api, product, payload, status):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    response = api.post(f"/api/chat/sessions/{sid}/messages/", payload, format="json")
    assert response.status_code == status, response.json()
    assert not Message.objects.exists()


def test_malformed_json_is_a_400(api):
    response = api.generic("POST", "/api/chat/sessions/", "{nope", content_type="application/json")
    assert response.status_code == 400


def test_a_body_over_the_upload_limit_is_a_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    response = api.post(
        f"/api/chat/sessions/{sid}/messages/", {"content": "x" * 5000}, format="json"
    )
    assert response.status_code == 413


def test_the_rate_limit_answers_429_with_retry_after(api, product, settings):
    settings.CHAT_RATE_LIMIT = 2
    one_rate_window(settings)
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    for _ in range(2):
        assert (
            api.post(
                f"/api/chat/sessions/{sid}/messages/",
                {"content": "How do I reset my password?"},
                format="json",
            ).status_code
            == 201
        )
    response = api.post(
        f"/api/chat/sessions/{sid}/messages/",
        {"content": "How do I reset my password?"},
        format="json",
    )
    assert response.status_code == 429
    assert (
        int(response["Retry-After"]) >= 1
        and "Too many questions" in response.json()["error"]["message"]
    )


def test_a_user_sees_nothing_of_another_users_sessions(api, bob_api, product):
    sid = api.post("/api/chat/sessions/", {"title": "mine"}, format="json").json()["id"]
    api.post(
        f"/api/chat/sessions/{sid}/messages/",
        {"content": "How do I reset my password?"},
        format="json",
    )
    assert bob_api.get("/api/chat/sessions/").json()["count"] == 0
    assert bob_api.get(f"/api/chat/sessions/{sid}/").status_code == 404
    assert bob_api.get(f"/api/chat/sessions/{sid}/messages/").status_code == 404
    assert (
        bob_api.patch(f"/api/chat/sessions/{sid}/", {"title": "x"}, format="json").status_code
        == 404
    )
    assert bob_api.delete(f"/api/chat/sessions/{sid}/").status_code == 404
    assert (
        bob_api.post(
            f"/api/chat/sessions/{sid}/messages/", {"content": "hi"}, format="json"
        ).status_code
        == 404
    )
    assert ChatSession.objects.get(pk=sid).title == "mine"


def test_anonymous_requests_are_refused(client):
    assert client.get("/api/chat/sessions/").status_code == 401
    assert client.get("/api/keys/").status_code in (401, 403)


# --- API keys -------------------------------------------------------------------------------------


def test_users_create_list_and_revoke_their_keys_and_see_the_key_once(api, bob_api):
    created = api.post("/api/keys/", {"name": "laptop", "scopes": ["chat"]}, format="json")
    assert created.status_code == 201
    raw = created.json()["key"]
    assert raw.startswith("gw_")
    listing = api.get("/api/keys/").json()["results"]
    assert listing[0]["name"] == "laptop" and "key" not in listing[0]
    assert ApiKey.objects.get().key_hash != raw and raw not in ApiKey.objects.get().key_hash

    bearer = APIClient(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert bearer.get("/api/chat/sessions/").status_code == 200
    assert ApiKey.objects.get().last_used_at is not None
    assert (
        bearer.post("/api/keys/", {"name": "minted"}, format="json").status_code == 403
    )  # keys cannot mint keys

    foreign = bob_api.delete(f"/api/keys/{listing[0]['id']}/")
    assert foreign.status_code == 404
    assert foreign.json() == {
        "error": {"code": "not_found", "message": f"No API key {listing[0]['id']}.", "fields": {}}
    }
    assert api.delete(f"/api/keys/{listing[0]['id']}/").status_code == 204
    assert bearer.get("/api/chat/sessions/").status_code == 401


def test_key_validation(api, alice):
    assert (
        api.post("/api/keys/", {"name": "", "scopes": ["chat"]}, format="json").status_code == 400
    )
    assert (
        api.post("/api/keys/", {"name": "x", "scopes": ["root"]}, format="json").status_code == 400
    )
    response = api.post("/api/keys/", {"name": "x", "scopes": ["kb"]}, format="json")
    assert response.status_code == 400 and "staff" in json.dumps(response.json())
    api.post("/api/keys/", {"name": "dup", "scopes": ["chat"]}, format="json")
    assert (
        api.post("/api/keys/", {"name": "dup", "scopes": ["chat"]}, format="json").status_code
        == 400
    )


def test_scopes_gate_the_apis(alice, django_user_model, kb_staff_key=None):
    chat_only = apikey_create(user=alice, name="chat", scopes=["chat"])[1]
    assert (
        APIClient(HTTP_AUTHORIZATION=f"Bearer {chat_only}").get("/api/kb/entries/").status_code
        == 403
    )
    curator = staff_user(
        "curator", verbs=EVERY_VERB
    )  # the KB API needs the entry model's permissions
    kb_key = apikey_create(user=curator, name="kb", scopes=["kb"])[1]
    assert (
        APIClient(HTTP_AUTHORIZATION=f"Bearer {kb_key}").get("/api/kb/entries/").status_code == 200
    )
    assert (
        APIClient(HTTP_AUTHORIZATION=f"Bearer {kb_key}").get("/api/chat/sessions/").status_code
        == 403
    )


def test_createapikey_prints_only_the_key_on_its_last_line(alice, capsys):
    call_command("createapikey", "--user", "alice", "--scope", "chat")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[-1].startswith("gw_")
    assert (
        APIClient(HTTP_AUTHORIZATION=f"Bearer {out[-1]}").get("/api/chat/sessions/").status_code
        == 200
    )
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("createapikey", "--user", "nobody")


def test_the_api_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert {"/api/chat/sessions/", "/api/chat/sessions/{id}/messages/", "/api/keys/"} <= set(
        schema["paths"]
    )
    assert client.get("/api/docs/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_client_that_hangs_up_mid_stream_leaves_a_cancelled_turn_with_what_it_got(
    asgi_server, alice, alice_key, product
):
    import http.client
    import time
    import urllib.request
    from urllib.parse import urlsplit

    session = ChatSession.objects.create(user=alice)
    url = urlsplit(asgi_server)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request(
        "POST",
        f"/api/chat/sessions/{session.pk}/messages/stream",
        body=json.dumps({"content": "Tell me a long story about the sea", "max_tokens": 2000}),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {alice_key}"},
    )
    response = connection.getresponse()
    assert response.status == 200
    received = b""
    while received.count(b"event: token") < 3:
        received += response.read1(4096)
    connection.sock.shutdown(2)  # the browser tab closes: no more reading, no goodbye
    connection.close()

    deadline = time.monotonic() + 15
    while (message := Message.objects.get(session=session, role="assistant")).status == "streaming":
        assert time.monotonic() < deadline, "the turn was never closed"
        time.sleep(0.1)
    assert message.status == "cancelled"
    assert message.content  # what was generated before the hang-up is kept
    # The server goes on serving on the same pool of request threads.
    request = urllib.request.Request(
        f"{asgi_server}/api/chat/sessions/{session.pk}/messages/",
        headers={"Authorization": f"Bearer {alice_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as history:
        assert [m["status"] for m in json.loads(history.read())["results"]] == [
            "complete",
            "cancelled",
        ]


def _rate_count(user) -> int:
    from django.conf import settings

    from core import redis as core_redis

    keys = list(core_redis.client().scan_iter(f"{settings.REDIS_KEY_PREFIX}:chat:rate:{user.pk}:*"))
    return sum(int(core_redis.client().get(key) or 0) for key in keys)


@pytest.mark.parametrize(
    "content", ["reset my\x00 password", "reset my \ud800 password", "ring \x1b[31m red"]
)
@pytest.mark.parametrize("path", ["messages/", "messages/stream"])
def test_text_that_cannot_be_stored_is_a_400_and_costs_no_rate_limit(
    api, alice, product, content, path
):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    # Sent as ASCII JSON: the lone surrogate travels as the escape "\ud800", as a client sends it.
    response = api.generic(
        "POST",
        f"/api/chat/sessions/{sid}/{path}",
        json.dumps({"content": content}),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"]
    assert not Message.objects.exists()
    assert _rate_count(alice) == 0


def test_a_session_title_that_cannot_be_stored_is_a_400(api):
    response = api.generic(
        "POST",
        "/api/chat/sessions/",
        json.dumps({"title": "trip \ud800"}),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert not ChatSession.objects.exists()
