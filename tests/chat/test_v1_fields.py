"""The /v1 field policy, row by row (docs/api.md, "Every field"): each field of OpenAI's chat
completion request, and vLLM's own, sent through the real gateway to an engine that records what it
receives, as a target of each kind. A field is passed on as sent, owned by the gateway, or refused
with a 400 that names it: never dropped without a word."""

import json
import urllib.error
import urllib.request

import pytest

from inference_ops import openai_fields
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import StubEngine

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "Tell me about the sea"}]
KINDS = ("vllm", "cpu", "external")
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
# A valid value of every field the gateway passes on (or sends to some kinds only).
SAMPLES = {
    "temperature": 0.3,
    "top_p": 0.9,
    "n": 2,
    "stop": ["\n\n", "END"],
    "seed": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": False,
    "user": "customer-42",
    "reasoning_effort": "low",
    "metadata": {"team": "support"},
    "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "draft"},
    "web_search_options": {"search_context_size": "low"},
    "service_tier": "flex",
    "store": True,
    "moderation": {"model": "omni-moderation-latest"},
    "prompt_cache_key": "tenant-1",
    "prompt_cache_options": {"mode": "implicit"},
    "prompt_cache_retention": "24h",
    "safety_identifier": "user-hash",
    "verbosity": "low",
    "functions": [TOOL["function"]],
    "function_call": "auto",
    "top_k": 20,
    "min_p": 0.05,
    "ignore_eos": True,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "repetition_penalty": 1.1,
    "stop_token_ids": [1, 2],
    "include_stop_str_in_output": True,
    "min_tokens": 1,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 100,
    "allowed_token_ids": [5, 6, 7],
    "bad_words": ["darn"],
    "echo": False,
    "add_generation_prompt": True,
    "continue_final_message": False,
    "add_special_tokens": False,
    "documents": [{"title": "a", "text": "b"}],
    "chat_template_kwargs": {"enable_thinking": False},
    "mm_processor_kwargs": {"num_crops": 4},
    "structured_outputs": {"json": SCHEMA},
    "return_tokens_as_token_ids": True,
    "cache_salt": "tenant-salt",
    "repetition_detection": {"max_pattern_size": 8},
    "watermarking": False,
    "truncation_side": "left",
    "logprob_token_ids": [1, 2],
    "media_io_kwargs": {"video": {"num_frames": 8}},
    "thinking_token_budget": 64,
    "include_reasoning": False,
    "routed_experts_prompt_start": 0,
    "session_id": "conversation-1",
    "stream_interval": 2,
}
# What a field goes with to make sense (each of these takes every kind).
COMPANIONS = {
    "top_logprobs": {"logprobs": True},
    "tool_choice": {"tools": [TOOL]},
    "parallel_tool_calls": {"tools": [TOOL]},
}
PASSED_ON = sorted(
    set(openai_fields.EVERY)
    | set(openai_fields.EXTERNAL_ONLY)
    | set(openai_fields.VLLM_ONLY)
    | set(openai_fields.LOCAL_SAMPLING)
)


@pytest.fixture(scope="module")
def recorder():
    engine = StubEngine().start()
    yield engine
    engine.stop()


@pytest.fixture
def targets(recorder):
    """One endpoint of each kind, all on the recording engine, listed by the default rule."""
    made = {
        kind: endpoint(f"rec-{kind}", url=f"{recorder.url}/v1", kind=kind, model="quick")
        for kind in KINDS
    }
    rule("default", *made.values(), is_default=True, use_kb_context=False)
    recorder.received.clear()
    return made


def post(asgi_server, key, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{asgi_server}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_samples_cover_every_field_the_gateway_passes_on():
    assert set(SAMPLES) == set(PASSED_ON)
    assert openai_fields.KNOWN == (
        set(PASSED_ON) | set(openai_fields.GATEWAY) | set(openai_fields.REFUSED)
    )


@pytest.mark.parametrize("name", PASSED_ON)
def test_a_field_reaches_the_engines_that_take_it_as_sent_and_is_refused_by_name_elsewhere(
    asgi_server, alice_key, targets, recorder, name
):
    value = SAMPLES[name]
    takes = openai_fields.kinds_taking(name, value)
    for kind in KINDS:
        recorder.received.clear()
        status, body = post(
            asgi_server,
            alice_key,
            {"model": f"rec-{kind}", "messages": ASK, name: value, **COMPANIONS.get(name, {})},
        )
        if kind in takes:
            assert status == 200, body
            (sent,) = recorder.received
            assert sent[name] == value, (kind, sent)
        else:
            assert status == 400, body
            error = body["error"]
            assert error["param"] == name and error["code"] == "unsupported_parameter"
            assert f"`{name}`" in error["message"] and f"rec-{kind}" in error["message"]
            assert recorder.received == []  # never sent to be ignored


@pytest.mark.parametrize("name", sorted(openai_fields.REFUSED))
def test_a_field_that_is_the_operators_is_refused_by_name(
    asgi_server, alice_key, targets, recorder, name
):
    status, body = post(asgi_server, alice_key, {"model": "auto", "messages": ASK, name: 1})
    assert status == 400 and body["error"]["param"] == name
    assert body["error"]["code"] == "unsupported_parameter"
    assert recorder.received == []


def test_a_field_nobody_knows_is_refused_by_name(asgi_server, alice_key, targets, recorder):
    status, body = post(
        asgi_server, alice_key, {"model": "auto", "messages": ASK, "temprature": 0.2}
    )
    assert status == 400 and body["error"]["param"] == "temprature"
    assert "temprature" in body["error"]["message"] and recorder.received == []


def test_the_gateway_owns_the_model_the_stream_and_usage(asgi_server, alice_key, targets, recorder):
    status, _ = post(asgi_server, alice_key, {"model": "rec-external", "messages": ASK})
    (sent,) = recorder.received
    assert status == 200
    assert sent["model"] == "quick"  # the target's served name, not the client's
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_token_ceiling_keeps_its_name_and_never_passes_the_rules(
    asgi_server, alice_key, targets, recorder, field
):
    from routing.models import RoutingRule

    RoutingRule.objects.filter(name="default").update(max_tokens=50)
    from routing.rules import rules_changed

    rules_changed()
    for asked, sent_value in ((20, 20), (5000, 50)):
        recorder.received.clear()
        status, _ = post(
            asgi_server, alice_key, {"model": "rec-vllm", "messages": ASK, field: asked}
        )
        (sent,) = recorder.received
        assert status == 200 and sent[field] == sent_value
        other = "max_tokens" if field == "max_completion_tokens" else "max_completion_tokens"
        assert other not in sent


def test_auto_routing_passes_over_a_target_that_takes_no_field_of_the_request(
    asgi_server, alice_key, recorder
):
    external = endpoint("rec-external", url=f"{recorder.url}/v1", kind="external", model="quick")
    local = endpoint("rec-vllm", url=f"{recorder.url}/v1", kind="vllm", model="quick")
    rule("default", external, local, is_default=True, use_kb_context=False)
    recorder.received.clear()
    status, body = post(
        asgi_server,
        alice_key,
        {"model": "auto", "messages": ASK, "structured_outputs": {"json": {}}},
    )
    assert status == 200 and body["model"] == "auto:rec-vllm"
    assert [sent["structured_outputs"] for sent in recorder.received] == [{"json": {}}]
    # What no target of the rule takes together: a 400 naming a field, nothing sent.
    recorder.received.clear()
    status, body = post(
        asgi_server,
        alice_key,
        {"model": "auto", "messages": ASK, "structured_outputs": {"json": {}}, "store": True},
    )
    assert status == 400 and body["error"]["param"] in ("structured_outputs", "store")
    assert recorder.received == []


def test_the_docs_table_says_each_fields_policy_as_the_code_does():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = text.split("<!-- fields:start -->")[1].split("<!-- fields:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        name, policy, vllm, cpu, external = (cell.strip() for cell in line.strip("|").split("|"))
        rows[name.strip("`")] = (policy, {"vllm": vllm, "cpu": cpu, "external": external})
    assert set(rows) == set(openai_fields.KNOWN)
    for name, (policy, marks) in rows.items():
        if name in openai_fields.REFUSED:
            assert policy.startswith("refused") and set(marks.values()) == {"400"}, name
        elif name in openai_fields.GATEWAY:
            assert policy.startswith("the gateway's") and set(marks.values()) == {"✓"}, name
        else:
            takes = openai_fields.kinds_taking(name, SAMPLES[name])
            expected = {kind: "✓" if kind in takes else "400" for kind in KINDS}
            assert marks == expected, name
