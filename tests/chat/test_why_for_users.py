"""What a route says to whom: a user reads the road and a plain reason; the staff who may read the
routing rules (as the route explainer requires) read the details (KB scores, rule conditions, the
endpoints and how they failed). The stored turn keeps the details for the admin."""

import json
import urllib.error
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from chat.models import ChatSession, Message
from knowledge.services.entries import entry_create
from tests.support.factories import endpoint, rule
from tests.support.personas import staff_user
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "http://127.0.0.1:1/v1"  # nothing listens there: a connection refused at once
# What only operators may read: the failed endpoint's name and failure, a rule's condition, KB
# scores.
DETAILS = (
    "broken",
    "connect",
    "catches everything",
    "exact match",
    "score",
    "threshold",
    "circuit",
)


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def fallback(external_sim):
    """The KB answers one question; the rule tries a dead endpoint first, then the external
    model."""
    entry_create(
        question="How do I reset my password?", answer="Use **Forgot password**.", embed="sync"
    )
    broken = endpoint("broken", url=DEAD)
    external = endpoint("external", external_sim, kind="external")
    rule("default", broken, external, is_default=True, use_kb_context=False, max_tokens=3)


@pytest.fixture
def all_down():
    rule(
        "default", endpoint("broken", url=DEAD), is_default=True, use_kb_context=False, max_tokens=3
    )


@pytest.fixture
def operator():
    """Staff who may read the routing rules."""
    return staff_user("olga", perms=("routing.view_routingrule",))


@pytest.fixture
def plain_staff():
    """Staff without the routing rules' view permission: no more than a user here."""
    return staff_user("stan")


def details_in(text: str) -> list[str]:
    return [word for word in DETAILS if word in text]


async def socket_frames(user, content: str) -> list[dict]:
    socket = await socket_for(user, connect=True)
    await socket.send_json_to({"type": "message", "session": None, "content": content})
    frames = []
    while not frames or frames[-1]["type"] not in ("done", "error"):
        frames.append(await socket.receive_json_from(timeout=20))
    await socket.disconnect()
    return frames


def frame(frames, kind: str) -> dict:
    return next(f for f in frames if f["type"] == kind)


# --- the browser socket ---------------------------------------------------------------------------


async def test_a_user_reads_the_road_and_a_plain_reason_of_a_kb_answer(alice, fallback):
    route = frame(await socket_frames(alice, "how do I reset my password?"), "route")
    assert route["road"] == "kb" and route["why"] == "answered from the knowledge base"


async def test_a_user_reads_that_the_answer_came_by_a_fallback_but_not_which_endpoint_failed(
    alice, fallback
):
    frames = await socket_frames(alice, "Tell me about the lighthouses of Brittany")
    route = frame(frames, "route")
    assert route["road"] == "external" and frames[-1]["type"] == "done"
    assert route["why"].startswith("answered by the external model") and "fallback" in route["why"]
    assert details_in(json.dumps(frames)) == []


async def test_the_routing_staff_read_the_details_on_the_socket(operator, fallback):
    kb = frame(await socket_frames(operator, "how do I reset my password?"), "route")
    assert "exact match" in kb["why"]
    generated = frame(
        await socket_frames(operator, "Tell me about the lighthouses of Brittany"), "route"
    )
    assert "broken: connect" in generated["why"] and "catches everything" in generated["why"]


async def test_staff_without_the_routing_rules_view_permission_read_what_a_user_reads(
    plain_staff, fallback
):
    frames = await socket_frames(plain_staff, "Tell me about the lighthouses of Brittany")
    assert details_in(json.dumps(frames)) == []


async def test_a_user_reads_a_plain_error_when_no_model_answers_and_the_turn_keeps_the_details(
    alice, all_down
):
    error = (await socket_frames(alice, "Tell me about the sea"))[-1]
    assert error["type"] == "error" and error["status"] == "failed"
    assert details_in(error["message"]) == [] and "could answer" in error["message"]
    stored = await Message.objects.aget(pk=error["message_id"])
    assert "broken: connect" in stored.error  # for the admin


async def test_the_routing_staff_read_which_endpoint_failed(operator, all_down):
    error = (await socket_frames(operator, "Tell me about the sea"))[-1]
    assert "broken: connect" in error["message"]


# --- the DRF API ----------------------------------------------------------------------------------


def stream_events(base: str, user, content: str) -> list[tuple[str, dict]]:
    key = apikey_create(user=user, name="integration", scopes=["chat"])[1]
    session = ChatSession.objects.create(user=user)
    request = urllib.request.Request(
        f"{base}/api/chat/sessions/{session.pk}/messages/stream",
        method="POST",
        data=json.dumps({"content": content}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return [
        (
            block.split("\n", 1)[0].removeprefix("event: "),
            json.loads(block.split("\n", 1)[1].removeprefix("data: ")),
        )
        for block in text.strip().split("\n\n")
    ]


def test_the_drf_stream_gives_a_user_a_plain_reason_and_the_routing_staff_the_details(
    asgi_server, alice, operator, fallback
):
    events = stream_events(asgi_server, alice, "Tell me about the lighthouses of Brittany")
    route = dict(events)["route"]
    assert route["road"] == "external" and route["why"].startswith("answered by the external model")
    assert details_in(json.dumps(events)) == []
    staff_route = dict(
        stream_events(asgi_server, operator, "Tell me about the lighthouses of Brittany")
    )["route"]
    assert "broken: connect" in staff_route["why"]


def test_the_drf_stream_gives_a_user_a_plain_error(asgi_server, alice, all_down):
    events = stream_events(asgi_server, alice, "Tell me about the sea")
    name, error = events[-1]
    assert name == "error" and details_in(error["message"]) == []


def test_a_users_stored_conversation_shows_the_plain_error_and_the_routing_staff_the_details(
    alice, operator, all_down
):
    for user in (alice, operator):
        api = APIClient()
        api.force_login(user)
        session = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
        sent = api.post(
            f"/api/chat/sessions/{session}/messages/",
            {"content": "Tell me about the sea"},
            format="json",
        ).json()["assistant_message"]
        listed = api.get(f"/api/chat/sessions/{session}/messages/").json()["results"][-1]
        if user is alice:
            assert sent["status"] == "failed" and details_in(sent["error"]) == [] and sent["error"]
            assert listed["error"] == sent["error"]
        else:
            assert "broken: connect" in sent["error"] and "broken: connect" in listed["error"]


# --- /v1 ------------------------------------------------------------------------------------------


def v1_error(base: str, user) -> dict:
    key = apikey_create(user=user, name="sdk", scopes=["chat"])[1]
    body = {"model": "auto", "messages": [{"role": "user", "content": "Tell me about the sea"}]}
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(request, timeout=30)
    return json.loads(failed.value.read())["error"]


def test_v1_gives_a_user_a_plain_error_and_the_routing_staff_the_details(
    asgi_server, alice, operator, all_down
):
    assert details_in(v1_error(asgi_server, alice)["message"]) == []
    assert "broken: connect" in v1_error(asgi_server, operator)["message"]
