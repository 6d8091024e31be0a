"""Bad input on every endpoint and frame gets a clear 4xx in that interface's documented shape, and
nothing is stored half-way; HTML and script are text like any other, stored and returned as sent.

Through a live daphne, as clients send it (raw bytes, wrong types, broken encodings). What the
interfaces' own test modules already cover (an empty or blank question, a question over the size
limit, a negative max_tokens, an unknown model, malformed JSON on /v1, the body limit, NUL and
other characters that cannot be stored) is not repeated here.
"""

import json
import urllib.error
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from chat.models import ChatSession, Message
from knowledge.models import Entry
from tests.support.personas import EVERY_VERB, staff_user
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "Tell me about the sea"}]
OPENAI_SHAPE = {"message", "type", "param", "code"}
GATEWAY_SHAPE = {"code", "message", "fields"}


def send(
    url,
    body: bytes | None,
    *,
    method="POST",
    key=None,
    content_type="application/json",
    headers=None,
):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if content_type:
        request.add_header("Content-Type", content_type)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def stored() -> tuple[int, int, int]:
    return ChatSession.objects.count(), Message.objects.count(), Entry.objects.count()


def v1(**fields) -> bytes:
    return json.dumps({"model": "auto", "messages": ASK, **fields}).encode()


# --- /v1/chat/completions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", None),
        (b"[]", None),
        (b'"hello"', None),
        (b"42", None),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "caf\xe9"}]}',
            None,
        ),  # Latin-1, not UTF-8
        (b'{"model": "auto", "messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}', None),
        (json.dumps({"model": 7, "messages": ASK}).encode(), "model"),
        (json.dumps({"model": "auto", "messages": "hello"}).encode(), "messages"),
        (json.dumps({"model": "auto", "messages": {"role": "user"}}).encode(), "messages"),
        (json.dumps({"model": "auto", "messages": ["hello"]}).encode(), "messages[0]"),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "wizard", "content": "hi"}]}
            ).encode(),
            "messages[0]",
        ),
        (json.dumps({"model": "auto", "messages": [{"content": "hi"}]}).encode(), "messages[0]"),
        (
            json.dumps({"model": "auto", "messages": [{"role": "user", "content": None}]}).encode(),
            "messages[0]",
        ),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "user", "content": ["hi"]}]}
            ).encode(),
            "messages[0]",
        ),
        (
            json.dumps(
                {
                    "model": "auto",
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}
                    ],
                }
            ).encode(),
            "messages[0]",
        ),
        (
            json.dumps(
                {"model": "auto", "messages": [*ASK, {"role": "tool", "content": "42"}]}
            ).encode(),
            "messages[1]",
        ),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "user", "content": "hi", "tool_calls": []}]}
            ).encode(),
            "messages[0]",
        ),
        (v1(tools=[{"type": "function", "function": {"name": "no spaces allowed"}}]), "tools"),
        (v1(tool_choice="sometimes"), "tool_choice"),
        (v1(response_format={"type": "xml"}), "response_format"),
        (v1(top_logprobs=3), "top_logprobs"),
        (v1(logprobs="yes"), "logprobs"),
        (v1(stop=["a"] * 17), "stop"),
        (v1(stream_options={"include_usage": True}), "stream_options"),
        (v1(stream=True, stream_options={"include_obfuscation": True}), "stream_options"),
        (v1(priority=-10), "priority"),
        (v1(temprature=0.5), "temprature"),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "user", "content": "\n\t \r\n"}]}
            ).encode(),
            "messages",
        ),
        (v1(max_tokens=0), "max_tokens"),
        (v1(max_tokens=10**12), "max_tokens"),
        (v1(max_tokens="5"), "max_tokens"),
        (v1(max_tokens=True), "max_tokens"),
        (v1(max_tokens=2.5), "max_tokens"),
        (v1(max_completion_tokens=-3), "max_completion_tokens"),
        (v1(temperature=-0.1), "temperature"),
        (v1(temperature=1e308), "temperature"),
        (v1(n=17), "n"),
        (v1(n=0), "n"),
        (v1(n="1"), "n"),
        (v1(stream="yes"), "stream"),
        (v1(stream=True, stream_options=["include_usage"]), "stream_options"),
    ],
)
def test_v1_refuses_bad_bodies_with_a_400_in_openais_shape(
    asgi_server, alice_key, product, body, param
):
    before = stored()
    status, headers, raw = send(f"{asgi_server}/v1/chat/completions", body, key=alice_key)
    assert status == 400, raw
    assert headers["Content-Type"] == "application/json"
    error = json.loads(raw)["error"]
    assert (
        set(error) == OPENAI_SHAPE and error["type"] == "invalid_request_error" and error["message"]
    )
    assert error["param"] == param
    assert stored() == before


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/chat/completions", 405),
        ("POST", "/v1/models", 405),
        ("GET", "/v1/completions", 405),
        ("GET", "/v1/embeddings", 405),
        ("POST", "/v1/responses", 404),
        ("POST", "/v1/chat/completions/", 404),
    ],
)
def test_v1_answers_wrong_methods_and_paths_in_openais_shape(
    asgi_server, alice_key, method, path, status
):
    code, _, raw = send(
        f"{asgi_server}{path}", v1() if method == "POST" else None, method=method, key=alice_key
    )
    assert code == status, raw
    assert set(json.loads(raw)["error"]) == OPENAI_SHAPE


HOSTILE = '<script>alert("q")</script><img src=x onerror=alert(1)> & "quotes" \u202e'


def test_v1_takes_html_and_script_as_text_and_stores_them_as_sent(
    asgi_server, alice_key, alice, product
):
    session = ChatSession.objects.create(user=alice, title="mine")
    status, headers, raw = send(
        f"{asgi_server}/v1/chat/completions",
        v1(messages=[{"role": "user", "content": HOSTILE}], max_tokens=3),
        key=alice_key,
        headers={"X-Session-Id": str(session.pk)},
    )
    assert status == 200, raw
    assert (
        headers["Content-Type"] == "application/json"
        and headers["X-Content-Type-Options"] == "nosniff"
    )
    assert Message.objects.get(session__user=alice, role="user").content == HOSTILE


# --- the DRF chat API -----------------------------------------------------------------------------


@pytest.fixture
def session(alice):
    return ChatSession.objects.create(user=alice, title="mine")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("body", "content_type", "status", "field"),
    [
        (b'{"content": "caf\xe9"}', "application/json", 400, None),  # not UTF-8
        (b"[]", "application/json", 400, None),
        (b'"hello"', "application/json", 400, None),
        (b"", "application/json", 400, "content"),
        (b"content=hello", "text/plain", 415, None),
        (json.dumps({"content": ["hello"]}).encode(), "application/json", 400, "content"),
        (json.dumps({"content": None}).encode(), "application/json", 400, "content"),
        (json.dumps({"content": {"text": "hi"}}).encode(), "application/json", 400, "content"),
        (
            json.dumps({"content": "hi", "max_tokens": 10**12}).encode(),
            "application/json",
            400,
            "max_tokens",
        ),
        (
            json.dumps({"content": "hi", "max_tokens": 0}).encode(),
            "application/json",
            400,
            "max_tokens",
        ),
        (
            json.dumps({"content": "hi", "max_tokens": True}).encode(),
            "application/json",
            400,
            "max_tokens",
        ),
        (
            json.dumps({"content": "hi", "max_tokens": "many"}).encode(),
            "application/json",
            400,
            "max_tokens",
        ),
        (
            json.dumps({"content": "hi", "temperature": 9}).encode(),
            "application/json",
            400,
            "temperature",
        ),
        (
            json.dumps({"content": "hi", "temperature": "warm"}).encode(),
            "application/json",
            400,
            "temperature",
        ),
    ],
)
def test_the_chat_api_refuses_bad_messages_in_its_shape_and_stores_nothing(
    asgi_server, alice_key, session, product, stream, body, content_type, status, field
):
    before = stored()
    path = f"/api/chat/sessions/{session.pk}/messages/" + ("stream" if stream else "")
    code, headers, raw = send(
        f"{asgi_server}{path}", body, key=alice_key, content_type=content_type
    )
    assert code == status, raw
    assert headers["Content-Type"] == "application/json"
    error = json.loads(raw)["error"]
    assert set(error) == GATEWAY_SHAPE and error["message"] and error["code"]
    if field:
        assert field in error["fields"], error
    assert stored() == before


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/api/chat/sessions/999999/messages/", {"content": "hi"}, 404),
        ("GET", "/api/chat/sessions/999999/", None, 404),
        ("PATCH", "/api/chat/sessions/{sid}/", {"title": ["a", "list"]}, 400),
        ("PATCH", "/api/chat/sessions/{sid}/", {"title": "x" * 201}, 400),
        ("PUT", "/api/chat/sessions/{sid}/messages/", {"content": "hi"}, 405),
        (
            "POST",
            "/api/keys/",
            {"name": "k", "scopes": "chat"},
            403,
        ),  # keys are managed from a browser session
    ],
)
def test_the_chat_api_answers_wrong_ids_types_and_methods_in_its_shape(
    asgi_server, alice_key, session, method, path, body, status
):
    before = stored()
    code, _, raw = send(
        f"{asgi_server}{path.format(sid=session.pk)}",
        None if body is None else json.dumps(body).encode(),
        method=method,
        key=alice_key,
    )
    assert code == status, raw
    assert set(json.loads(raw)["error"]) == GATEWAY_SHAPE
    assert stored() == before
    assert ChatSession.objects.get(pk=session.pk).title == "mine"


def test_the_chat_api_takes_html_and_script_as_text(asgi_server, alice_key, session, product):
    code, _, raw = send(
        f"{asgi_server}/api/chat/sessions/{session.pk}/messages/",
        json.dumps({"content": HOSTILE, "max_tokens": 3}).encode(),
        key=alice_key,
    )
    assert code == 201, raw
    assert json.loads(raw)["user_message"]["content"] == HOSTILE
    assert Message.objects.get(session=session, role="user").content == HOSTILE


# --- the KB API -----------------------------------------------------------------------------------


@pytest.fixture
def curator_key(django_user_model):
    from chat.apikeys import apikey_create

    curator = staff_user(
        "curator", verbs=EVERY_VERB
    )  # the KB API needs the entry model's permissions
    return apikey_create(user=curator, name="kb", scopes=["kb"])[1]


GOOD_ENTRY = {"question": "Do you ship to Chile?", "answer": "Yes."}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"question": "caf\xe9", "answer": "x"}', None),
        (b"[]", None),
        (json.dumps({"answer": "Yes."}).encode(), "question"),
        (json.dumps({"question": "", "answer": "Yes."}).encode(), "question"),
        (json.dumps({"question": "   ", "answer": "Yes."}).encode(), "question"),
        (json.dumps({**GOOD_ENTRY, "question": 42}).encode(), "question"),
        (json.dumps({**GOOD_ENTRY, "kind": "poem"}).encode(), "kind"),
        (json.dumps({**GOOD_ENTRY, "aliases": "ship to Chile"}).encode(), "aliases"),
        (json.dumps({**GOOD_ENTRY, "aliases": [["nested"]]}).encode(), "aliases"),
        (json.dumps({**GOOD_ENTRY, "tags": ["t" * 65]}).encode(), "tags"),
        (json.dumps({**GOOD_ENTRY, "threshold": "high"}).encode(), "threshold"),
        (json.dumps({**GOOD_ENTRY, "active": "maybe"}).encode(), "active"),
    ],
)
def test_the_kb_api_refuses_bad_entries_in_its_shape_and_writes_nothing(
    asgi_server, curator_key, body, field
):
    before = stored()
    code, _, raw = send(f"{asgi_server}/api/kb/entries/", body, key=curator_key)
    assert code == 400, raw
    error = json.loads(raw)["error"]
    assert set(error) == GATEWAY_SHAPE and error["message"]
    if field:
        assert any(name.startswith(field) for name in error["fields"]), error
    assert stored() == before


@pytest.mark.parametrize(
    "query", ["", "q=", "q=%20%20", "q=" + "x" * 2001, "q=hi&k=0", "q=hi&k=99", "q=hi&k=two"]
)
def test_the_kb_search_refuses_bad_queries_in_its_shape(asgi_server, curator_key, query):
    code, _, raw = send(
        f"{asgi_server}/api/kb/search?{query}",
        None,
        method="GET",
        key=curator_key,
        content_type=None,
    )
    assert code == 400, raw
    assert set(json.loads(raw)["error"]) == GATEWAY_SHAPE


def test_the_kb_stores_html_in_an_answer_as_sent(asgi_server, curator_key):
    code, headers, raw = send(
        f"{asgi_server}/api/kb/entries/",
        json.dumps({"question": "What about <b>bold</b>?", "answer": HOSTILE}).encode(),
        key=curator_key,
    )
    assert code == 201, raw
    assert headers["Content-Type"] == "application/json"
    assert json.loads(raw)["answer"] == HOSTILE and Entry.objects.get().answer == HOSTILE


# --- the chat socket ------------------------------------------------------------------------------


@pytest.fixture
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("   ", "bad_json"),
        ("[1, 2]", "unknown_type"),
        ("null", "unknown_type"),
        ('"message"', "unknown_type"),
        ('{"type": 5}', "unknown_type"),
        ('{"type": "message", "session": true, "content": "hi"}', "bad_request"),
        ('{"type": "message", "session": 1.5, "content": "hi"}', "bad_request"),
        ('{"type": "message", "session": 999999, "content": "hi"}', "not_found"),
        ('{"type": "message", "session": null}', "invalid_message"),
        ('{"type": "message", "session": null, "content": ["hi"]}', "invalid_message"),
        ('{"type": "message", "session": null, "content": "\\n\\t "}', "invalid_message"),
    ],
)
async def test_bad_socket_frames_get_an_error_frame_store_nothing_and_the_socket_stays(
    alice, product, close_executor_connections, frame, code
):
    socket = await socket_for(alice, connect=True)
    await socket.send_to(text_data=frame)
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == code and reply["message"]
    assert not await Message.objects.aexists()
    await socket.send_json_to({"type": "ping"})  # still open, still answering
    assert (await socket.receive_json_from(timeout=10))["code"] == "unknown_type"
    await socket.disconnect()


async def test_a_binary_socket_frame_gets_an_error_frame(alice, close_executor_connections):
    socket = await socket_for(alice, connect=True)
    await socket.send_to(bytes_data=b'{"type": "message", "session": null, "content": "hi"}')
    reply = await socket.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "bad_json"
    await socket.disconnect()
