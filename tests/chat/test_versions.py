"""Regenerating the last answer and editing the last question: new versions of the last exchange,
in the DRF API and over the chat socket, the old versions kept, the next turn's history made of
the current ones only."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

from chat import services
from chat.models import ChatSession, Message
from tests.chat.test_chat_socket import frames_until_end
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db

QUESTION = "Tell me about the sea"


def send(api, sid, content):
    response = api.post(f"/api/chat/sessions/{sid}/messages/", {"content": content}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def conversation(api, sid):
    return api.get(f"/api/chat/sessions/{sid}/messages/").json()["results"]


def test_regenerating_the_last_answer_keeps_the_old_one_as_an_earlier_version(api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)
    old = first["assistant_message"]

    response = api.post(f"/api/chat/messages/{old['id']}/regenerate", {}, format="json")

    assert response.status_code == 201, response.json()
    turn = response.json()
    new = turn["assistant_message"]
    assert new["id"] != old["id"] and new["status"] == "complete" and new["road"] == "local"
    assert new["content"] == QUESTION  # the echoing engine answered the same question again
    assert new["version_of"] == old["id"] and new["superseded"] is False
    assert turn["user_message"]["id"] == first["user_message"]["id"]
    assert turn["session"]["id"] == sid
    messages = conversation(api, sid)
    assert [(m["role"], m["superseded"]) for m in messages] == [
        ("user", False),
        ("assistant", True),
        ("assistant", False),
    ]

    # A second regenerate: all three versions name the first one.
    third = api.post(f"/api/chat/messages/{new['id']}/regenerate", format="json").json()
    assert third["assistant_message"]["version_of"] == old["id"]
    assert Message.objects.filter(session_id=sid, superseded=True).count() == 2


def test_editing_the_last_question_answers_the_new_text_and_keeps_the_old_pair(api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)

    response = api.post(
        f"/api/chat/messages/{first['user_message']['id']}/edit",
        {"content": "Tell me about the mountains"},
        format="json",
    )

    assert response.status_code == 201, response.json()
    turn = response.json()
    assert turn["user_message"]["content"] == "Tell me about the mountains"
    assert turn["user_message"]["version_of"] == first["user_message"]["id"]
    assert turn["assistant_message"]["content"] == "Tell me about the mountains"
    assert turn["assistant_message"]["version_of"] == first["assistant_message"]["id"]
    assert [(m["role"], m["content"], m["superseded"]) for m in conversation(api, sid)] == [
        ("user", QUESTION, True),
        ("assistant", QUESTION, True),
        ("user", "Tell me about the mountains", False),
        ("assistant", "Tell me about the mountains", False),
    ]


def test_the_next_turn_reads_the_current_versions_only(api, alice, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)
    api.post(f"/api/chat/messages/{first['assistant_message']['id']}/regenerate", format="json")
    edited = api.post(
        f"/api/chat/messages/{first['user_message']['id']}/edit",
        {"content": "And the rivers?"},
        format="json",
    )
    assert edited.status_code == 201

    start = async_to_sync(services.aturn_start)(user=alice, session_id=sid, content="Next")

    assert start.history == [
        {"role": "user", "content": "And the rivers?"},
        {"role": "assistant", "content": "And the rivers?"},
    ]


def test_only_the_last_exchange_gets_a_new_version(api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)
    send(api, sid, "How do I reset my password?")

    regenerate = api.post(
        f"/api/chat/messages/{first['assistant_message']['id']}/regenerate", format="json"
    )
    edit = api.post(
        f"/api/chat/messages/{first['user_message']['id']}/edit",
        {"content": "Something else"},
        format="json",
    )

    for response in (regenerate, edit):
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "not_last_exchange"
        assert "Only the last answer can be regenerated" in response.json()["error"]["message"]
    assert Message.objects.filter(session_id=sid).count() == 4
    assert not Message.objects.filter(superseded=True).exists()


def test_a_question_is_not_regenerated_nor_an_answer_edited(api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    turn = send(api, sid, QUESTION)

    wrong_regenerate = api.post(
        f"/api/chat/messages/{turn['user_message']['id']}/regenerate", format="json"
    )
    wrong_edit = api.post(
        f"/api/chat/messages/{turn['assistant_message']['id']}/edit",
        {"content": "x"},
        format="json",
    )

    assert wrong_regenerate.status_code == 400
    assert wrong_regenerate.json()["error"]["message"] == "Only an answer can be regenerated."
    assert wrong_edit.status_code == 400
    assert Message.objects.filter(session_id=sid).count() == 2


@pytest.mark.parametrize(("content", "status"), [("", 400), ("   ", 400), ("x" * 20000, 413)])
def test_a_bad_edit_is_refused_and_nothing_changes(api, product, content, status):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    turn = send(api, sid, QUESTION)

    response = api.post(
        f"/api/chat/messages/{turn['user_message']['id']}/edit",
        {"content": content},
        format="json",
    )

    assert response.status_code == status, response.json()
    assert Message.objects.filter(session_id=sid).count() == 2
    assert not Message.objects.filter(superseded=True).exists()


def test_an_answer_still_being_written_is_not_regenerated(api, alice):
    session = ChatSession.objects.create(user=alice)
    Message.objects.create(session=session, role="user", content=QUESTION)
    streaming = Message.objects.create(session=session, role="assistant", status="streaming")

    response = api.post(f"/api/chat/messages/{streaming.pk}/regenerate", format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "answer_not_finished"


def test_another_users_messages_are_not_found(api, bob_api, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    turn = send(api, sid, QUESTION)

    for url, body in [
        (f"/api/chat/messages/{turn['assistant_message']['id']}/regenerate", {}),
        (f"/api/chat/messages/{turn['user_message']['id']}/edit", {"content": "mine now"}),
        ("/api/chat/messages/999999/regenerate", {}),
        ("/api/chat/messages/999999/edit", {"content": "nobody's"}),
    ]:
        response = bob_api.post(url, body, format="json")
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found"
    assert Message.objects.filter(session_id=sid).count() == 2
    assert not Message.objects.filter(superseded=True).exists()


@pytest.fixture
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_executor_connections")
async def test_the_socket_streams_a_regenerated_answer_and_an_edited_question(alice, bob, product):
    socket = await socket_for(alice)
    assert (await socket.connect())[0]
    await socket.send_json_to({"type": "message", "session": None, "content": QUESTION})
    first = await frames_until_end(socket)
    old_answer = first[-1]["message_id"]
    question = first[0]["question_id"]

    await socket.send_json_to({"type": "regenerate", "message_id": old_answer})
    frames = await frames_until_end(socket)

    assert frames[0]["type"] == "session" and frames[0]["question_id"] == question
    assert "token" in [f["type"] for f in frames] and frames[-1]["type"] == "done"
    regenerated = await Message.objects.aget(pk=frames[-1]["message_id"])
    assert (regenerated.version_of_id, regenerated.content) == (old_answer, QUESTION)
    assert (await Message.objects.aget(pk=old_answer)).superseded

    await socket.send_json_to({"type": "edit", "message_id": question, "content": "And rivers?"})
    frames = await frames_until_end(socket)
    assert frames[-1]["type"] == "done"
    edited = await Message.objects.aget(pk=frames[0]["question_id"])
    assert (edited.content, edited.version_of_id) == ("And rivers?", question)

    # An earlier answer, a bad id, another user's message: an error frame, the socket stays open.
    await socket.send_json_to({"type": "regenerate", "message_id": old_answer})
    refused = await socket.receive_json_from(timeout=10)
    assert (refused["type"], refused["code"]) == ("error", "not_last_exchange")
    await socket.send_json_to({"type": "regenerate", "message_id": "1"})
    assert (await socket.receive_json_from(timeout=10))["code"] == "bad_request"
    await socket.disconnect()

    intruder = await socket_for(bob)
    assert (await intruder.connect())[0]
    await intruder.send_json_to({"type": "edit", "message_id": edited.pk, "content": "mine"})
    refused = await intruder.receive_json_from(timeout=10)
    assert (refused["type"], refused["code"]) == ("error", "not_found")
    await intruder.disconnect()
    # The first question and its two answers, the edited question and its answer.
    assert await Message.objects.filter(session_id=edited.session_id).acount() == 5


def sse_post(asgi_server, path, body, key):
    """POST to the chat API's streaming variant on the real ASGI app: (status, content type,
    [(event, data)]), the body read to its end."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{asgi_server}/api/chat/{path}",
        method="POST",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            kind, text = response.headers["Content-Type"], response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], json.loads(exc.read())
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return status, kind, events


@pytest.mark.django_db(transaction=True)
def test_regenerate_and_edit_stream_as_server_sent_events(asgi_server, api, alice_key, product):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)
    old = first["assistant_message"]["id"]

    status, kind, events = sse_post(asgi_server, f"messages/{old}/regenerate/stream", {}, alice_key)

    assert status == 200 and kind.startswith("text/event-stream")
    names = [name for name, _ in events]
    assert names[:2] == ["session", "route"] and names[-1] == "done", names
    assert set(names[2:-1]) == {"token"}
    assert "".join(data["text"] for name, data in events if name == "token") == QUESTION
    regenerated = Message.objects.get(pk=events[0][1]["message_id"])
    assert (regenerated.version_of_id, regenerated.content, regenerated.status) == (
        old,
        QUESTION,
        "complete",
    )
    assert Message.objects.get(pk=old).superseded

    question = first["user_message"]["id"]
    status, _, events = sse_post(
        asgi_server, f"messages/{question}/edit/stream", {"content": "And the rivers?"}, alice_key
    )

    assert status == 200 and events[-1][0] == "done"
    assert "".join(data["text"] for name, data in events if name == "token") == "And the rivers?"
    edited = Message.objects.get(pk=events[0][1]["question_id"])
    assert (edited.content, edited.version_of_id) == ("And the rivers?", question)
    assert [(m["role"], m["content"]) for m in conversation(api, sid) if not m["superseded"]] == [
        ("user", "And the rivers?"),
        ("assistant", "And the rivers?"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_refused_streaming_redo_is_a_plain_4xx_and_changes_nothing(
    asgi_server, api, alice_key, product
):
    sid = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
    first = send(api, sid, QUESTION)
    second = send(api, sid, "How do I reset my password?")

    refusals = [
        (f"messages/{first['assistant_message']['id']}/regenerate/stream", {}, 409),
        (f"messages/{first['user_message']['id']}/edit/stream", {"content": "x"}, 409),
        (f"messages/{second['user_message']['id']}/regenerate/stream", {}, 400),
        (f"messages/{second['user_message']['id']}/edit/stream", {"content": "  "}, 400),
        ("messages/999999/regenerate/stream", {}, 404),
    ]
    # More refusals than the user has stream slots (8, the server's default): each one gave its
    # slot back.
    for path, body, expected in refusals * 2:
        status, kind, body = sse_post(asgi_server, path, body, alice_key)
        assert (status, kind) == (expected, "application/json"), (path, body)
        assert body["error"]["message"]
    assert Message.objects.filter(session_id=sid).count() == 4
    assert not Message.objects.filter(superseded=True).exists()

    # And the last answer can still be regenerated, streamed.
    status, _, events = sse_post(
        asgi_server,
        f"messages/{second['assistant_message']['id']}/regenerate/stream",
        {},
        alice_key,
    )
    assert status == 200 and events[-1][0] == "done"
