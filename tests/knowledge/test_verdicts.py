"""People's verdicts on answers: a thumbs up or down from the chat page (its socket and REST
call), the DRF API and /v1; a direct answer marked wrong lands in the curators' review queue,
where they mark it right or wrong."""

import uuid

import openai
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import Client

from chat.apikeys import apikey_create
from chat.feedback import completion_id, completion_key
from chat.models import ChatSession, Message
from knowledge.hits import hit_flush, review_queue
from knowledge.models import Feedback, Hit
from observability.models import RequestLog
from observability.requestlog import request_flush
from tests.support.personas import client_of
from tests.support.polling import wait_until
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _hits_recorded(settings):
    """This process records direct answers; its writer waits for the test's own flush."""
    settings.KB_RECORD_HITS = True
    settings.KB_MISS_FLUSH_SECONDS = 3600
    yield
    hit_flush()


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


async def _ask(user, question: str) -> list[dict]:
    socket = await socket_for(user, connect=True)
    await socket.send_json_to({"type": "message", "session": None, "content": question})
    frames = []
    while not frames or frames[-1]["type"] not in ("done", "error"):
        frames.append(await socket.receive_json_from(timeout=20))
    await socket.disconnect()
    return frames


def _feedback(client: Client, message_id, **body):
    return client.post(
        f"/api/chat/messages/{message_id}/feedback", body, content_type="application/json"
    )


async def test_a_direct_answer_is_kept_with_the_request_key_of_its_message(alice, product):
    frames = await _ask(alice, "How do I reset my password?")
    done = frames[-1]
    assert done["road"] == "kb"
    await sync_to_async(hit_flush)()
    message = await Message.objects.aget(pk=done["message_id"])
    hit = await Hit.objects.aget()
    assert (hit.question, hit.entry_id, hit.method) == (
        "How do I reset my password?",
        product["entry"].pk,
        "exact",
    )
    assert message.request_key == hit.key
    # The request log's row names the same answer.
    await sync_to_async(request_flush)()
    row = await RequestLog.objects.aget(request_key=hit.key)
    assert row.kb_hit and row.kb_entry_id == product["entry"].pk


async def test_a_thumbs_down_puts_the_direct_answer_in_the_review_queue_until_a_curator_judges_it(
    alice, product, curator_client
):
    done = (await _ask(alice, "How do I reset my password?"))[-1]
    await sync_to_async(hit_flush)()

    def judge():
        reply = _feedback(
            client_of(alice), done["message_id"], verdict="down", comment="I asked about my PIN"
        )
        assert reply.status_code == 200, reply.content
        assert reply.json() == {"id": done["message_id"], "verdict": "down", "note": ""}
        assert Message.objects.get(pk=done["message_id"]).verdict == "down"
        queued = list(review_queue())
        assert [(h.question, h.user_comment) for h in queued] == [
            ("How do I reset my password?", "I asked about my PIN")
        ]
        page = curator_client.get("/admin/knowledge/hit/?queue=open")
        assert page.status_code == 200
        assert "How do I reset my password?" in page.text and "I asked about my PIN" in page.text
        acted = curator_client.post(
            "/admin/knowledge/hit/",
            {"action": "mark_right", "_selected_action": [queued[0].pk]},
        )
        assert acted.status_code == 302
        hit = Hit.objects.get()
        assert hit.review == "right" and hit.reviewed_by.username == "curator"
        assert list(review_queue()) == []  # judged: out of the queue
        assert (
            "How do I reset my password?"
            not in curator_client.get("/admin/knowledge/hit/?queue=open").text
        )

    await sync_to_async(judge)()


async def test_a_verdict_can_be_changed_and_taken_back(alice, product):
    done = (await _ask(alice, "How do I reset my password?"))[-1]

    def change():
        client = client_of(alice)
        assert _feedback(client, done["message_id"], verdict="down").status_code == 200
        assert _feedback(client, done["message_id"], verdict="up").status_code == 200
        assert list(Feedback.objects.values_list("verdict", flat=True)) == ["up"]
        assert _feedback(client, done["message_id"], verdict="").json()["verdict"] == ""
        assert not Feedback.objects.exists()
        assert Message.objects.get(pk=done["message_id"]).verdict == ""
        # The message list shows the verdict the page draws.
        _feedback(client, done["message_id"], verdict="up")
        session = Message.objects.get(pk=done["message_id"]).session_id
        listed = client.get(f"/api/chat/sessions/{session}/messages/").json()["results"]
        assert [m["verdict"] for m in listed] == ["", "up"]

    await sync_to_async(change)()


def test_bad_verdicts_get_a_clear_4xx_and_change_nothing(alice, bob):
    session = ChatSession.objects.create(user=alice)
    answer = Message.objects.create(
        session=session, role="assistant", content="An answer.", request_key=uuid.uuid4()
    )
    question = Message.objects.create(session=session, role="user", content="A question?")
    running = Message.objects.create(
        session=session, role="assistant", status="streaming", request_key=uuid.uuid4()
    )
    alice_client, bob_client = client_of(alice), client_of(bob)

    wrong = _feedback(alice_client, answer.pk, verdict="sideways")
    assert wrong.status_code == 400 and "verdict" in wrong.json()["error"]["fields"]
    long = _feedback(alice_client, answer.pk, verdict="down", comment="x" * 2001)
    assert long.status_code == 400 and "comment" in long.json()["error"]["fields"]
    nul = _feedback(alice_client, answer.pk, verdict="down", comment="bad\x00")
    assert nul.status_code == 400
    assert _feedback(bob_client, answer.pk, verdict="down").status_code == 404  # not bob's
    assert _feedback(alice_client, question.pk, verdict="down").status_code == 404  # a question
    assert _feedback(alice_client, 10**9, verdict="down").status_code == 404
    busy = _feedback(alice_client, running.pk, verdict="up")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "answer_not_finished"
    assert Client().post(
        f"/api/chat/messages/{answer.pk}/feedback", {"verdict": "up"}
    ).status_code in (401, 403)
    assert not Feedback.objects.exists()
    assert set(Message.objects.values_list("verdict", flat=True)) == {""}


def test_a_completion_id_names_its_answer_for_its_user_only():
    key = uuid.uuid4()
    made = completion_id(key, 7)
    assert made.startswith("chatcmpl-") and completion_key(made, 7) == key
    assert completion_key(made, 8) is None  # another user's
    assert completion_key(made[:-1] + ("0" if made[-1] != "0" else "1"), 7) is None  # forged
    assert completion_key(f"chatcmpl-{key.hex}", 7) is None  # unsigned
    assert completion_key("chatcmpl-not-an-id", 7) is None


def test_a_v1_client_rates_a_completion_through_the_sdk(asgi_server, alice, bob, product):
    alice_key = apikey_create(user=alice, name="laptop", scopes=["chat"])[1]
    bob_key = apikey_create(user=bob, name="desk", scopes=["chat"])[1]
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0)
    completion = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "how do I reset my password?"}]
    )
    rated = client.chat.completions.update(
        completion.id, metadata={"feedback": "down", "comment": "not what I asked"}
    )
    assert rated.id == completion.id and rated.metadata["feedback"] == "down"
    feedback = Feedback.objects.get()
    assert (feedback.verdict, feedback.comment, feedback.interface, feedback.user) == (
        "down",
        "not what I asked",
        "v1",
        alice,
    )
    # The request log's row of that answer carries the same key: the dashboard joins them.
    row = wait_until(lambda: RequestLog.objects.filter(request_key=feedback.request_key).first())
    assert row.road == "kb" and row.user_id == alice.pk

    bob_client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=bob_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        bob_client.chat.completions.update(completion.id, metadata={"feedback": "up"})
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.update("chatcmpl-made-up", metadata={"feedback": "up"})
    with pytest.raises(openai.BadRequestError, match="feedback"):
        client.chat.completions.update(completion.id, metadata={"feedback": "maybe"})
    with pytest.raises(openai.BadRequestError, match="feedback"):
        client.chat.completions.update(completion.id, metadata={"comment": "no verdict"})
    assert Feedback.objects.get().verdict == "down"  # none of those changed it
