"""What /v1 does with requests beyond a text question: the knowledge base answers only where a
plain text answer satisfies the request, the limits count what is sent (tools' schemas, every
choice's ceiling), and history trimming keeps a tool call with its results. The engine records
what it receives (tests/support/stub_engine.py); the gateway is the real one."""

import json
import urllib.error
import urllib.request

import pytest

from knowledge.services.entries import entry_create
from spend.models import Limit
from tests.spend.test_limits import same_minute
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import StubEngine

pytestmark = pytest.mark.django_db(transaction=True)

KB_QUESTION = "How do I reset my password?"
TOOL = {
    "type": "function",
    "function": {
        "name": "open_ticket",
        "description": "Open a support ticket for the user, with a summary of the problem " * 4,
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}, "urgent": {"type": "boolean"}},
            "required": ["summary"],
        },
    },
}
SCHEMA = {"type": "object", "properties": {"steps": {"type": "array"}}}


@pytest.fixture(scope="module")
def recorder():
    engine = StubEngine().start()
    yield engine
    engine.stop()


@pytest.fixture
def routed(recorder):
    entry_create(question=KB_QUESTION, answer="Use **Forgot password**.", embed="sync")
    local = endpoint("local", url=f"{recorder.url}/v1", kind="vllm", model="quick")
    rule("default", local, is_default=True, use_kb_context=False)
    recorder.received.clear()
    return local


def post(asgi_server, key, body: dict):
    """(status, headers (case-insensitive), body)."""
    request = urllib.request.Request(
        f"{asgi_server}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


ASKED = [{"role": "user", "content": KB_QUESTION}]


@pytest.mark.parametrize(
    ("fields", "road"),
    [
        ({}, "kb"),
        ({"tools": [TOOL]}, "kb"),  # offered, not required: a text answer is one the model may give
        ({"tools": [TOOL], "tool_choice": "auto"}, "kb"),
        ({"tools": [TOOL], "tool_choice": "required"}, "local"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "local",
        ),
        ({"response_format": {"type": "json_object"}}, "local"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA},
                }
            },
            "local",
        ),
        ({"response_format": {"type": "text"}}, "kb"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "local"),
        ({"n": 2}, "local"),
        ({"logprobs": True}, "local"),
        ({"continue_final_message": True, "add_generation_prompt": False}, "local"),
    ],
)
def test_the_knowledge_base_answers_only_where_plain_text_satisfies_the_request(
    asgi_server, alice_key, routed, recorder, fields, road
):
    status, headers, body = post(
        asgi_server, alice_key, {"model": "auto", "messages": ASKED, **fields}
    )
    assert status == 200, body
    assert headers["X-Route"] == road
    assert len(recorder.received) == (road == "local")


def test_a_turn_that_ends_with_a_tool_result_goes_to_the_model_whatever_the_kb_holds(
    asgi_server, alice_key, routed, recorder
):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "open_ticket", "arguments": "{}"},
    }
    messages = [
        *ASKED,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ticket 42 opened"},
    ]
    status, headers, _ = post(
        asgi_server, alice_key, {"model": "auto", "messages": messages, "tools": [TOOL]}
    )
    assert status == 200 and headers["X-Route"] == "local"
    (sent,) = recorder.received
    # The question and the messages after it reach the engine as the client sent them.
    assert sent["messages"][-3:] == messages
    assert sent["tools"] == [TOOL]


def test_an_image_question_goes_to_the_model_with_its_parts(
    asgi_server, alice_key, routed, recorder
):
    question = {
        "role": "user",
        "content": [
            {"type": "text", "text": KB_QUESTION},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
    status, headers, _ = post(
        asgi_server, alice_key, {"model": "auto", "messages": [question], "max_tokens": 8}
    )
    assert status == 200 and headers["X-Route"] == "local"
    (sent,) = recorder.received
    assert sent["messages"][-1] == question


def reserved(asgi_server, alice, body: dict) -> int:
    """The tokens the gateway reserves for a request, as a new key's first request under a
    limit of its own shows them (the headers say what is left once the request is counted)."""
    from chat.apikeys import apikey_create

    key, raw = apikey_create(user=alice, name=f"key-{Limit.objects.count()}", scopes=["chat"])
    Limit.objects.create(api_key=key, tokens_per_minute=1_000_000)
    status, headers, answer = post(asgi_server, raw, body)
    assert status == 200, answer
    return 1_000_000 - int(headers["x-ratelimit-remaining-tokens"])


def test_the_reservation_counts_every_choices_ceiling_and_the_tools_schemas(
    asgi_server, alice, routed, recorder
):
    same_minute(10)
    question = [{"role": "user", "content": "Tell me about the sea"}]
    base = {"model": "local", "messages": question, "max_tokens": 100}
    one = reserved(asgi_server, alice, base)
    assert reserved(asgi_server, alice, {**base, "n": 4}) - one == 3 * 100
    # The tools' schemas go into the prompt the engine renders: at least a token per 4 bytes.
    assert (
        reserved(asgi_server, alice, {**base, "tools": [TOOL]}) - one
        >= len(json.dumps([TOOL])) // 4
    )


def test_trimming_keeps_a_tool_call_with_its_results_or_drops_both(
    asgi_server, alice_key, recorder
):
    small = endpoint(
        "small", url=f"{recorder.url}/v1", kind="vllm", model="quick", context_window=400
    )
    rule("default", small, is_default=True, use_kb_context=False, max_tokens=20)
    recorder.received.clear()
    history = []
    for turn in range(12):
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "open_ticket", "arguments": json.dumps({"summary": "x" * 40})},
        }
        history += [
            {"role": "user", "content": f"question {turn} " + "word " * 20},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": "done " * 10},
            {"role": "assistant", "content": f"answer {turn}"},
        ]
    question = {"role": "user", "content": "and now?"}
    status, _, body = post(
        asgi_server, alice_key, {"model": "auto", "messages": [*history, question], "tools": [TOOL]}
    )
    assert status == 200, body
    (sent,) = recorder.received
    kept = sent["messages"][1:-1]  # after the system message, before the question
    assert 0 < len(kept) < len(history)
    assert kept[0]["role"] == "user"  # the history starts at a user turn, never mid-exchange
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or ()}
    results = {m["tool_call_id"] for m in kept if m["role"] == "tool"}
    assert calls == results  # every call kept has its result, and no result lost its call
    assert sent["messages"][-1] == question
