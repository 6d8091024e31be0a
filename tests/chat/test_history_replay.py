"""A stored conversation's next turn starts as the engine received the last one: each earlier
question replayed with the KB passages it was sent with, byte for byte, so the engine finds the
conversation in its prefix cache. Over the real ASGI app (daphne), the chat API with a key, an
engine that records what it receives, and the simulator, whose prefix cache keeps vLLM's books."""

import itertools
import json
import time
import urllib.request

import pytest

from benchmarks.prefix import engine_counters
from chat.models import ChatSession, Message
from knowledge.services.entries import entry_create
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import StubEngine

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

QUESTIONS = [
    "Can I get my money back after the parcel arrived?",
    "And how long until the refund reaches my card?",
    "What about the shipping of a replacement?",
]


@pytest.fixture(scope="module")
def engine():
    server = StubEngine().start()
    yield server
    server.stop()


@pytest.fixture
def kb(db):
    # Passages for the questions above, none of them a direct answer to one.
    entry_create(
        kind="rule",
        question="Refund policy",
        answer="Refunds are paid to the original payment method within five working days.",
        embed="sync",
    )
    entry_create(
        kind="rule",
        question="Shipping policy",
        answer="Orders and replacements ship within two working days.",
        embed="sync",
    )


def post(url: str, body: dict, key: str) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201)
        return json.loads(response.read())


def passages_reach(asgi_server: str, key: str, sent_to_engine) -> None:
    """Wait until the gateway sends the test's KB passages: a web process keeps the embedding
    model's row for a few seconds, and each test's database is new. `sent_to_engine` reads, from
    a /v1 answer, whether the question went with passages."""
    deadline = time.monotonic() + 30
    while True:
        answer = post(
            f"{asgi_server}/v1/chat/completions",
            {"model": "auto", "messages": [{"role": "user", "content": QUESTIONS[0]}]},
            key,
        )
        if sent_to_engine(answer):
            return
        assert time.monotonic() < deadline, f"the gateway never sent the KB's passages: {answer}"
        time.sleep(2)


def converse(asgi_server: str, key: str, questions: list[str], session: int | None = None):
    """The questions asked one after the other in one stored session; the assistant messages."""
    if session is None:
        session = post(f"{asgi_server}/api/chat/sessions/", {}, key)["id"]
    answers = []
    for question in questions:
        reply = post(
            f"{asgi_server}/api/chat/sessions/{session}/messages/", {"content": question}, key
        )
        assert reply["assistant_message"]["status"] == "complete", reply
        answers.append(reply["assistant_message"])
    return session, answers


def test_each_turn_replays_the_earlier_questions_as_the_engine_received_them(
    asgi_server, alice_key, engine, kb
):
    rule(
        "default",
        endpoint("stub", url=f"{engine.url}/v1", model="quick"),
        is_default=True,
        use_kb_context=True,
        context_k=2,
    )
    passages_reach(
        asgi_server,
        alice_key,
        lambda _: "<passage " in engine.received[-1]["messages"][-1]["content"],
    )
    before = len(engine.received)
    _, answers = converse(asgi_server, alice_key, QUESTIONS)
    sent = [body["messages"] for body in engine.received[before:]]
    assert len(sent) == 3
    for turn, (earlier, later) in enumerate(itertools.pairwise(sent)):
        # The question went with its passages (so there was something to lose)...
        assert "<passage " in earlier[-1]["content"]
        assert earlier[-1]["content"].endswith(QUESTIONS[turn])
        # ...and the next turn starts with the whole of that prompt, the same bytes, then the
        # answer as the user read it, then the new question.
        assert json.dumps(later[: len(earlier)]) == json.dumps(earlier)
        assert later[len(earlier)] == {"role": "assistant", "content": answers[turn]["content"]}
        assert later[-1]["content"].endswith(QUESTIONS[turn + 1])
        assert len(later) == len(earlier) + 2


def test_the_next_turn_finds_the_conversation_in_the_engines_prefix_cache(
    asgi_server, alice_key, kb
):
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve",
        "acme/local",
        "--block-size",
        "16",
        "--mode",
        "echo",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "2",
    )
    try:
        rule(
            "default",
            endpoint("local", sim),
            is_default=True,
            use_kb_context=True,
            context_k=2,
            max_tokens=24,
        )
        # The echoing engine repeats the question as it got it: its passages first.
        passages_reach(
            asgi_server,
            alice_key,
            lambda answer: answer["choices"][0]["message"]["content"].startswith("<passage"),
        )
        session, _ = converse(asgi_server, alice_key, QUESTIONS[:2])
        queries, hits = engine_counters(sim.url)
        converse(asgi_server, alice_key, QUESTIONS[2:], session=session)
        queries_after, hits_after = engine_counters(sim.url)
    finally:
        sim.stop()
    earlier_prompt = (
        Message.objects.filter(session_id=session, role="assistant")
        .order_by("created_at", "pk")[1]
        .prompt_tokens
    )
    # The third turn's prompt found all of the second one's in the cache but its last partial
    # block: its passages included. Replayed as plain questions, only the system prompt matched.
    asked = Message.objects.filter(session_id=session, role="user").order_by("created_at", "pk")
    assert all("<passage " in question.context for question in asked)
    assert earlier_prompt and hits_after - hits >= earlier_prompt - 16
    assert queries_after - queries > hits_after - hits


def test_questions_stored_without_passages_still_replay_as_their_text(
    asgi_server, alice_key, alice, engine, kb
):
    rule(
        "default",
        endpoint("stub", url=f"{engine.url}/v1", model="quick"),
        is_default=True,
        use_kb_context=True,
        context_k=2,
    )
    passages_reach(
        asgi_server,
        alice_key,
        lambda _: "<passage " in engine.received[-1]["messages"][-1]["content"],
    )
    # A conversation stored before the passages were kept: its rows have none.
    session = ChatSession.objects.create(user=alice, title="older")
    Message.objects.create(session=session, role="user", content=QUESTIONS[0])
    Message.objects.create(session=session, role="assistant", content="Within 30 days.")
    before = len(engine.received)
    converse(asgi_server, alice_key, QUESTIONS[1:2], session=session.pk)
    [sent] = [body["messages"] for body in engine.received[before:]]
    assert sent[1:3] == [
        {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": "Within 30 days."},
    ]
    assert "<passage " in sent[3]["content"] and sent[3]["content"].endswith(QUESTIONS[1])
    # From this turn on, the new question is kept with its passages.
    stored = Message.objects.filter(session=session, role="user").order_by("created_at", "pk")
    assert [bool(m.context) for m in stored] == [False, True]
    assert sent[3]["content"] == f"{stored[1].context}\n\n{QUESTIONS[1]}"


# Strict: it fails the day the pipeline passes the switch, to be taken off then.
def test_a_rule_that_does_not_replay_passages_sends_the_earlier_questions_as_their_text(
    asgi_server, alice_key, engine, kb
):
    rule(
        "default",
        endpoint("stub", url=f"{engine.url}/v1", model="quick"),
        is_default=True,
        use_kb_context=True,
        context_k=2,
        replay_passages=False,
    )
    passages_reach(
        asgi_server,
        alice_key,
        lambda _: "<passage " in engine.received[-1]["messages"][-1]["content"],
    )
    before = len(engine.received)
    _, answers = converse(asgi_server, alice_key, QUESTIONS[:2])
    first, second = (body["messages"] for body in engine.received[before:])
    # Each question still goes with its passages, and they are kept...
    assert "<passage " in first[-1]["content"] and "<passage " in second[-1]["content"]
    # ...but the next turn sends the earlier question as the user wrote it: a shorter prompt
    # whose cached start ends at that question.
    assert second[1:3] == [
        {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": answers[0]["content"]},
    ]
