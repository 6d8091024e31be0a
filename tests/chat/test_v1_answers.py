"""The engine's answer comes back whole through /v1: tool-call deltas in order with their indices,
ids and argument fragments, the finish reason the engine gave, logprobs, several choices, a
refusal, the system fingerprint and the usage's details, streamed and not. The engine is a stub
that writes vLLM's chunks for each (tests/support/stub_engine.py); the client is the official SDK,
as an agent framework would use it."""

import time

import openai
import pytest

from observability.models import RequestLog
from tests.support.factories import endpoint, rule
from tests.support.stub_engine import FINGERPRINT, SCRIPT_USAGE, StubEngine

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALLS = [
    ("chatcmpl-tool-1", "get_weather", '{"city": "Paris"}'),
    ("chatcmpl-tool-2", "get_time", "{}"),
]


@pytest.fixture(scope="module")
def stub():
    engine = StubEngine().start()
    yield engine
    engine.stop()


@pytest.fixture
def scripted(stub):
    """One endpoint per script of the stub, each a target of the default rule."""
    made = [
        endpoint(name, url=f"{stub.url}/v1", kind="vllm", model=name)
        for name in ("toolcall", "choices", "refusal")
    ]
    rule("default", *made, is_default=True, use_kb_context=False)


def sdk(asgi_server, key):
    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=30)


def test_tool_calls_come_back_whole_without_streaming(asgi_server, alice_key, scripted):
    completion = sdk(asgi_server, alice_key).chat.completions.create(
        model="toolcall", messages=ASK, tools=TOOLS
    )
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == (
        CALLS
    )
    assert completion.system_fingerprint == FINGERPRINT
    assert completion.usage.prompt_tokens_details.cached_tokens == 16


def test_tool_call_deltas_stream_in_order_with_their_indices_and_fragments(
    asgi_server, alice_key, scripted
):
    stream = sdk(asgi_server, alice_key).chat.completions.create(
        model="toolcall",
        messages=ASK,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [
        call
        for chunk in chunks
        for choice in chunk.choices
        for call in (choice.delta.tool_calls or [])
    ]
    # The engine's fragments, as it sent them: the call's id and name once, then the arguments.
    assert [(d.index, d.id, d.function.name, d.function.arguments) for d in deltas] == [
        (0, "chatcmpl-tool-1", "get_weather", ""),
        (0, None, None, '{"city": '),
        (0, None, None, '"Paris"}'),
        (1, "chatcmpl-tool-2", "get_time", "{}"),
    ]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.total_tokens == SCRIPT_USAGE["total_tokens"]
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 16


def test_the_sdks_stream_helper_puts_the_tool_calls_together(asgi_server, alice_key, scripted):
    with sdk(asgi_server, alice_key).chat.completions.stream(
        model="toolcall", messages=ASK, tools=TOOLS
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == CALLS


@pytest.mark.parametrize("streamed", [False, True])
def test_several_choices_with_logprobs_come_back_each_with_its_index_and_finish(
    asgi_server, alice_key, scripted, streamed
):
    client = sdk(asgi_server, alice_key)
    asked = dict(model="choices", messages=ASK, n=2, logprobs=True, top_logprobs=1)
    if streamed:
        texts, logprobs, finishes = {0: "", 1: ""}, {0: [], 1: []}, {}
        for chunk in client.chat.completions.create(**asked, stream=True):
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                if choice.logprobs and choice.logprobs.content:
                    logprobs[choice.index] += [lp.token for lp in choice.logprobs.content]
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
    else:
        completion = client.chat.completions.create(**asked)
        texts = {c.index: c.message.content for c in completion.choices}
        logprobs = {c.index: [lp.token for lp in c.logprobs.content] for c in completion.choices}
        finishes = {c.index: c.finish_reason for c in completion.choices}
    assert texts == {0: "Hello there", 1: "Hi"}
    assert logprobs == {0: ["Hello", " there"], 1: ["Hi"]}
    assert finishes == {0: "stop", 1: "length"}


def test_a_refusal_comes_back_as_the_models_refusal(asgi_server, alice_key, scripted):
    client = sdk(asgi_server, alice_key)
    message = client.chat.completions.create(model="refusal", messages=ASK).choices[0].message
    assert message.refusal == "I can't help with that." and not message.content
    streamed = "".join(
        chunk.choices[0].delta.refusal or ""
        for chunk in client.chat.completions.create(model="refusal", messages=ASK, stream=True)
        if chunk.choices
    )
    assert streamed == "I can't help with that."


def test_the_request_log_says_what_a_request_asked_beyond_text(
    asgi_server, alice_key, alice, scripted
):
    client = sdk(asgi_server, alice_key)
    client.chat.completions.create(model="toolcall", messages=ASK, tools=TOOLS)
    client.chat.completions.create(model="choices", messages=ASK, n=2, logprobs=True)
    client.chat.completions.create(model="refusal", messages=ASK)
    deadline = time.monotonic() + 10
    while RequestLog.objects.filter(user=alice).count() < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # the gateway writes its rows in batches, a fraction of a second apart
    rows = dict(RequestLog.objects.filter(user=alice).values_list("target", "features"))
    assert rows == {"toolcall": "tools tool_calls", "choices": "logprobs n", "refusal": ""}
