"""The vLLM simulator, exercised as a real process over real HTTP with the OpenAI SDK."""

import asyncio
import json
import re
import subprocess
import sys
import time

import aiohttp
import openai
import pytest

from core.processes import free_port
from inference_ops.simulator.cli import parse_args
from inference_ops.simulator.config import DEFAULT_MODEL, LoraModule
from inference_ops.simulator.prefix_cache import PrefixCache

from .simulator_process import REPO, RunningSimulator, launch_simulator, start_simulator

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")


def sdk(sim: RunningSimulator, timeout: float = 10) -> openai.AsyncOpenAI:
    # No retries: each test must see exactly the failure the simulator produced.
    return openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", timeout=timeout, max_retries=0)


async def post(
    sim: RunningSimulator, path: str, body, headers: dict | None = None
) -> tuple[int, object]:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        kwargs = {"data": body} if isinstance(body, (str, bytes)) else {"json": body}
        async with session.post(sim.url + path, headers=headers, **kwargs) as response:
            text = await response.text()
            is_json = response.content_type == "application/json"
            return response.status, json.loads(text) if is_json else text


async def metrics(sim: RunningSimulator) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        async with session.get(sim.url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = SAMPLE.match(line).groups()
            samples[(name, labels or "")] = float(value)
    return samples


def sample(samples: dict, name: str, **labels: str) -> float:
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    matches = [v for (n, lbl), v in samples.items() if n == name and wanted <= set(lbl.split(","))]
    assert len(matches) == 1, f"{name} {labels}: {matches}"
    return matches[0]


async def token_count(sim: RunningSimulator, text: str) -> int:
    status, body = await post(sim, "/tokenize", {"prompt": text})
    assert status == 200
    return body["count"]


async def stream_chat(client: openai.AsyncOpenAI, **kwargs) -> list:
    stream = await client.chat.completions.create(stream=True, **kwargs)
    return [chunk async for chunk in stream]


# -- models, chat, completions -------------------------------------------------------------


async def test_it_lists_the_base_models_and_the_adapters_with_root_and_parent(simulator):
    async with sdk(simulator) as client:
        models = await client.models.list()
    cards = {card.id: card for card in models.data}
    assert set(cards) == {"base", "base-alias", "sql", "legal"}
    assert (cards["base"].root, cards["base"].parent, cards["base"].max_model_len) == (
        "acme/base-7b",
        None,
        256,
    )
    assert (cards["base-alias"].root, cards["base-alias"].parent) == ("acme/base-7b", None)
    assert (cards["sql"].root, cards["sql"].parent) == ("/adapters/sql", "base")
    assert (cards["legal"].root, cards["legal"].parent) == ("/adapters/legal", "base")


async def test_it_streams_a_chat_with_the_role_first_exactly_max_tokens_and_a_usage_chunk(
    simulator,
):
    async with sdk(simulator) as client:
        chunks = await stream_chat(
            client,
            model="base",
            messages=STORY,
            max_tokens=17,
            stream_options={"include_usage": True},
        )
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    *content, last = chunks
    assert last.choices == []
    assert last.usage.completion_tokens == 17
    assert last.usage.total_tokens == last.usage.prompt_tokens + 17
    _status, tokenized = await post(simulator, "/tokenize", {"model": "base", "messages": STORY})
    assert last.usage.prompt_tokens == tokenized["count"]
    finish_reasons = [chunk.choices[0].finish_reason for chunk in content]
    assert finish_reasons[-1] == "length"
    assert set(finish_reasons[:-1]) == {None}
    text = "".join(chunk.choices[0].delta.content or "" for chunk in content)
    assert await token_count(simulator, text) == 17


async def test_the_raw_stream_is_server_sent_events_ending_with_done(simulator):
    body = {
        "messages": STORY,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        async with session.post(simulator.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            raw = (await response.read()).decode()
    events = raw.split("\n\n")
    assert events.pop() == ""
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"
    usage_chunk = json.loads(events[-2].removeprefix("data: "))
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    assert (
        json.loads(events[0].removeprefix("data: "))["model"] == "base"
    )  # no model: the primary name


async def test_it_answers_a_chat_without_streaming_under_the_primary_name_like_vllm(simulator):
    async with sdk(simulator) as client:
        response = await client.chat.completions.create(
            model="base-alias", messages=STORY, max_completion_tokens=9
        )
    assert response.object == "chat.completion"
    assert response.model == "base"
    choice = response.choices[0]
    assert (choice.message.role, choice.finish_reason) == ("assistant", "length")
    assert response.usage.completion_tokens == 9
    assert await token_count(simulator, choice.message.content) == 9


async def test_without_max_tokens_it_stops_by_itself_after_a_plausible_length(simulator):
    async with sdk(simulator) as client:
        response = await client.chat.completions.create(model="base", messages=STORY)
    assert response.choices[0].finish_reason == "stop"
    assert 8 <= response.usage.completion_tokens <= 64


async def test_the_same_seed_generates_the_same_text(simulator):
    async with sdk(simulator) as client:
        first, second = [
            await client.chat.completions.create(
                model="base", messages=STORY, max_tokens=12, seed=42
            )
            for _ in range(2)
        ]
    assert first.choices[0].message.content == second.choices[0].message.content


async def test_it_serves_text_completions_streamed_and_not_through_an_adapter(simulator):
    async with sdk(simulator) as client:
        response = await client.completions.create(
            model="sql", prompt="SELECT the answer", max_tokens=6
        )
        stream = await client.completions.create(
            model="sql",
            prompt="SELECT",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert (response.object, response.model) == ("text_completion", "sql")
    assert response.usage.completion_tokens == 6
    assert response.usage.prompt_tokens == await token_count(simulator, "SELECT the answer")
    assert {chunk.object for chunk in chunks} == {"text_completion"}
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert await token_count(simulator, "".join(c.choices[0].text for c in chunks[:-1])) == 5


async def test_in_echo_mode_it_repeats_the_last_user_message_cut_at_max_tokens(echo_simulator):
    messages = [
        {"role": "user", "content": "an older question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "The quick brown fox, it jumps."},
    ]
    async with sdk(echo_simulator) as client:
        whole = await client.chat.completions.create(model="acme/echo", messages=messages)
        cut = await client.chat.completions.create(
            model="acme/echo", messages=messages, max_tokens=3
        )
    assert whole.choices[0].message.content == "The quick brown fox, it jumps."
    assert (whole.choices[0].finish_reason, whole.usage.completion_tokens) == ("stop", 8)
    assert cut.choices[0].message.content == "The quick brown"
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 3)


async def test_a_stop_string_ends_generation_and_never_shows_even_across_tokens(echo_simulator):
    messages = [{"role": "user", "content": "alpha beta STOP gamma delta"}]
    async with sdk(echo_simulator) as client:
        response = await client.chat.completions.create(
            model="acme/echo", messages=messages, stop="STOP"
        )
        chunks = await stream_chat(
            client, model="acme/echo", messages=messages, stop=["zzz", "a ST"]
        )
    assert response.choices[0].message.content == "alpha beta "
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].model_extra["stop_reason"] == "STOP"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "alpha bet"
    assert chunks[-1].choices[0].finish_reason == "stop"


# -- errors ----------------------------------------------------------------------------------


async def test_a_generative_model_has_no_embeddings_route_like_vllm(simulator):
    # vLLM 0.32 registers the routes of its runner only: FastAPI's 404 for the others.
    async with sdk(simulator) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.embeddings.create(model="base", input="hello")
    assert info.value.body == {"detail": "Not Found"}


async def test_a_pooling_model_serves_embeddings_in_float_and_base64():
    sim = start_simulator("serve", "acme/embed", "--embedding-dim", "64")
    try:
        async with sdk(sim) as client:
            # The SDK asks for base64 by default and decodes it.
            response = await client.embeddings.create(
                model="acme/embed", input=["hello world", "hello there"]
            )
            floats = await client.embeddings.create(
                model="acme/embed", input="hello world", encoding_format="float"
            )
        assert [len(item.embedding) for item in response.data] == [64, 64]
        assert response.usage.prompt_tokens > 0
        assert floats.data[0].embedding == pytest.approx(response.data[0].embedding, abs=1e-6)
    finally:
        sim.stop()


async def test_a_pooling_runner_serves_embeddings_of_texts_and_token_ids_and_no_generation():
    sim = start_simulator("serve", "acme/embed", "--runner", "pooling", "--convert", "embed")
    try:
        async with sdk(sim) as client:
            texts = await client.embeddings.create(
                model="acme/embed", input=["a b c", "d"], encoding_format="float"
            )
            ids = await client.embeddings.create(
                model="acme/embed", input=[[1, 2, 3], [4]], encoding_format="float"
            )
            with pytest.raises(openai.NotFoundError):
                await client.completions.create(model="acme/embed", prompt="hi", max_tokens=2)
            with pytest.raises(openai.BadRequestError) as shorter:
                await client.embeddings.create(model="acme/embed", input="hi", dimensions=8)
        status, raw = await post(sim, "/v1/embeddings", {"input": "a b c"})
    finally:
        sim.stop()
    assert [len(item.embedding) for item in texts.data] == [384, 384]
    assert (texts.usage.prompt_tokens, ids.usage.prompt_tokens) == (4, 4)
    assert [item.index for item in ids.data] == [0, 1]
    assert shorter.value.body["message"] == (
        "Model 'acme/embed' does not support Matryoshka embeddings; dimensions must be unset "
        "(received dimensions=8)."
    )
    # UsageInfo as vLLM dumps it.
    assert status == 200 and raw["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 3,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_a_generative_runner_takes_no_pooling_flags():
    with pytest.raises(SystemExit):
        parse_args(["serve", "acme/x", "--runner", "generate", "--embedding-dim", "8"])
    assert parse_args(["serve", "acme/x", "--runner", "pooling"]).embedding_dim == 384
    assert parse_args(["serve", "acme/x", "--convert", "classify"]).cross_encoder
    assert not parse_args(["serve", "acme/x"]).pooling


def test_the_key_comes_from_api_key_first_then_vllm_api_key_as_in_vllm():
    assert parse_args(["serve", "acme/x"], environ={}).api_keys == ()
    assert parse_args(["serve", "acme/x"], environ={"VLLM_API_KEY": "k"}).api_keys == ("k",)
    flags = ["serve", "acme/x", "--api-key", "a", "b"]
    assert parse_args(flags, environ={"VLLM_API_KEY": "k"}).api_keys == ("a", "b")


async def test_a_completion_echoes_its_prompt_first_streamed_or_not(simulator):
    async with sdk(simulator) as client:
        whole = await client.completions.create(
            model="base", prompt="Once upon", max_tokens=3, echo=True
        )
        stream = await client.completions.create(
            model="base", prompt="Once upon", max_tokens=3, echo=True, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert whole.choices[0].text.startswith("Once upon")
    assert len(whole.choices[0].text) > len("Once upon")
    assert chunks[0].choices[0].text.startswith("Once upon")
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert streamed.startswith("Once upon") and streamed.count("Once upon") == 1


async def test_a_suffix_is_refused_as_by_a_model_without_a_fim_template(simulator):
    async with sdk(simulator) as client:
        with pytest.raises(openai.BadRequestError) as fim:
            await client.completions.create(model="base", prompt="def f(", suffix=")", max_tokens=2)
        with pytest.raises(openai.BadRequestError) as echoed:
            await client.completions.create(
                model="base", prompt="x", suffix=")", echo=True, max_tokens=2
            )
        with pytest.raises(openai.BadRequestError) as empty:
            await client.completions.create(model="base", prompt="", max_tokens=2)
    assert fim.value.body["message"] == (
        "suffix is only supported for models with FIM completion rendering"
    )
    assert fim.value.body["param"] == "suffix"
    assert echoed.value.body["message"] == "Echo is unsupported with suffix."
    assert empty.value.body["message"].startswith(
        "Either prompt or prompt_embeds must be provided and non-empty."
    )


async def test_an_unknown_model_is_a_404_not_found_error_shaped_like_vllm(simulator):
    async with sdk(simulator) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="nope", messages=STORY)
    # Every served name of the base model, never the adapters.
    assert info.value.body == {
        "message": "The model `nope` does not exist. Valid aliases: base, base-alias.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    for path in ("/v1/completions", "/tokenize"):
        status, response = await post(simulator, path, {"model": "nope", "prompt": "hi"})
        assert (status, response["error"]) == (404, info.value.body)


async def test_a_request_naming_no_model_is_served_by_the_base_model_like_vllm(simulator):
    for path, body in [
        ("/v1/chat/completions", {"messages": STORY, "max_tokens": 2}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/completions", {"model": None, "prompt": "hi", "max_tokens": 2}),
        ("/v1/completions", {"model": "", "prompt": "hi", "max_tokens": 2}),
    ]:
        status, response = await post(simulator, path, body)
        assert (status, response["model"]) == (200, "base"), body
    status, response = await post(simulator, "/tokenize", {"prompt": "hi"})
    assert (status, response["count"]) == (200, 1)


async def test_a_request_beyond_the_context_window_is_a_400_bad_request(simulator):
    long_prompt = [{"role": "user", "content": "word " * 300}]
    async with sdk(simulator) as client:
        with pytest.raises(openai.BadRequestError) as long_input:
            await client.chat.completions.create(model="base", messages=long_prompt, max_tokens=10)
        with pytest.raises(openai.BadRequestError) as long_output:
            await client.completions.create(model="base", prompt="hi", max_tokens=256)
    assert long_input.value.body["type"] == "BadRequestError"
    assert long_input.value.body["message"].startswith(
        "This model's maximum context length is 256 tokens. However, you requested 10 output tokens"
    )
    assert "for a total of at least 257 tokens" in long_output.value.body["message"]


@pytest.mark.parametrize(
    ("body", "fragment", "kind"),
    [
        # What pydantic refuses is FastAPI's RequestValidationError, which vLLM 0.32 answers with
        # the type "Bad Request"; its own checks raise VLLMValidationError ("BadRequestError").
        ("{not json", "JSON decode error", "Bad Request"),
        ({"model": "base"}, "messages", "Bad Request"),
        ({"messages": STORY, "n": 0}, "n must be at least 1, got 0.", "BadRequestError"),
        ({"messages": STORY, "max_tokens": 0}, "max_tokens must be at least 1", "BadRequestError"),
        (
            {"messages": STORY, "temperature": -1},
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
            "BadRequestError",
        ),
        (
            {"messages": STORY, "stream_options": {"include_usage": True}},
            "stream=True",
            "BadRequestError",
        ),
    ],
)
async def test_malformed_requests_are_400_bad_request(simulator, body, fragment, kind):
    status, response = await post(
        simulator, "/v1/chat/completions", body, headers={"Content-Type": "application/json"}
    )
    assert status == 400
    assert response["error"]["type"] == kind
    assert response["error"]["code"] == 400
    assert fragment in response["error"]["message"]


async def test_tokenize_counts_a_prompt_and_chat_messages(simulator):
    status, prompt = await post(
        simulator, "/tokenize", {"model": "base", "prompt": "Hello, world!"}
    )
    assert status == 200
    assert prompt["count"] == 4 and len(prompt["tokens"]) == 4
    assert all(isinstance(t, int) for t in prompt["tokens"])
    assert prompt["max_model_len"] == 256
    status, chat = await post(simulator, "/tokenize", {"messages": STORY})
    assert chat["count"] > await token_count(
        simulator, STORY[0]["content"]
    )  # the chat template counts too


async def test_version_and_health_answer(simulator):
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        async with session.get(simulator.url + "/version") as response:
            assert "version" in await response.json()
        async with session.get(simulator.url + "/health") as response:
            assert (response.status, await response.read()) == (200, b"")


# -- metrics ---------------------------------------------------------------------------------


async def test_metrics_use_vllm_names_and_the_counters_grow_with_traffic(simulator):
    before = await metrics(simulator)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        sample(before, name, model_name="base")
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        sample(before, f"{name}_bucket", model_name="base", le="+Inf")
        sample(before, f"{name}_sum", model_name="base")

    async with sdk(simulator) as client:
        response = await client.chat.completions.create(model="base", messages=STORY, max_tokens=5)
    after = await metrics(simulator)

    def grew(name: str) -> float:
        return sample(after, name, model_name="base") - sample(before, name, model_name="base")

    assert grew("vllm:generation_tokens_total") == 5
    assert grew("vllm:prompt_tokens_total") == response.usage.prompt_tokens
    assert grew("vllm:time_to_first_token_seconds_count") == 1
    assert grew("vllm:e2e_request_latency_seconds_count") == 1
    assert sample(after, "vllm:num_requests_running", model_name="base") == 0


async def prefix_cache(sim: RunningSimulator, model_name: str) -> tuple[float, float]:
    """vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total."""
    samples = await metrics(sim)
    return (
        sample(samples, "vllm:prefix_cache_queries_total", model_name=model_name),
        sample(samples, "vllm:prefix_cache_hits_total", model_name=model_name),
    )


async def complete_and_count(
    sim: RunningSimulator, model: str, prompt: str, model_name: str
) -> tuple[float, float]:
    """Complete `prompt` and say how much it moved the prefix-cache counters."""
    queries, hits = await prefix_cache(sim, model_name)
    async with sdk(sim) as client:
        await client.completions.create(model=model, prompt=prompt, max_tokens=1)
    after_queries, after_hits = await prefix_cache(sim, model_name)
    return after_queries - queries, after_hits - hits


@pytest.mark.parametrize("words", [96, 100])
async def test_a_repeated_prompt_hits_its_whole_blocks_but_never_its_last_token(simulator, words):
    prompt = " ".join(f"beacon{words}x{i}" for i in range(words))
    tokens = await token_count(simulator, prompt)
    assert tokens == words
    assert await complete_and_count(simulator, "base", prompt, "base") == (
        tokens,
        0,
    )  # nothing cached yet
    # Blocks of 16; a prompt of exactly 6 blocks computes its last token again, and so the whole
    # last block.
    expected_hits = (tokens - 1) // 16 * 16
    assert expected_hits == {96: 80, 100: 96}[words]
    assert await complete_and_count(simulator, "base", prompt, "base") == (tokens, expected_hits)


async def test_a_prefix_cache_hit_is_a_chain_from_the_first_block(simulator):
    prompt = " ".join(f"harbor{i}" for i in range(64))
    await complete_and_count(simulator, "base", prompt, "base")
    # Blocks 1 to 3 are the same tokens as before, but after a different block 0: no hit at all.
    changed_first = "jetty" + prompt.removeprefix("harbor0")
    assert await complete_and_count(simulator, "base", changed_first, "base") == (64, 0)
    # A change in block 2 keeps blocks 0 and 1.
    changed_third = prompt.replace("harbor40", "jetty40")
    assert await complete_and_count(simulator, "base", changed_third, "base") == (64, 32)


async def test_an_adapter_does_not_hit_the_base_models_blocks_but_its_own(simulator):
    prompt = " ".join(f"keeper{i}" for i in range(50))
    await complete_and_count(simulator, "base", prompt, "base")
    assert await complete_and_count(simulator, "base", prompt, "base") == (50, 48)
    assert await complete_and_count(simulator, "sql", prompt, "base") == (50, 0)
    assert await complete_and_count(simulator, "sql", prompt, "base") == (50, 48)
    assert await complete_and_count(simulator, "legal", prompt, "base") == (50, 0)


async def test_the_next_turn_of_a_chat_hits_the_blocks_of_the_previous_answer(echo_simulator):
    first_turn = [{"role": "user", "content": " ".join(f"lamp{i}" for i in range(40))}]
    async with sdk(echo_simulator) as client:
        answer = await client.chat.completions.create(model="acme/echo", messages=first_turn)
        second_turn = [
            *first_turn,
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
        queries, hits = await prefix_cache(echo_simulator, "acme/echo")
        await client.chat.completions.create(model="acme/echo", messages=second_turn, max_tokens=1)
    after_queries, after_hits = await prefix_cache(echo_simulator, "acme/echo")
    prompt, generated = answer.usage.prompt_tokens, answer.usage.completion_tokens
    status, tokenized = await post(echo_simulator, "/tokenize", {"messages": second_turn})
    assert status == 200 and after_queries - queries == tokenized["count"]
    # The first prompt and the answer but its last token (sampled, never fed back), in whole blocks:
    # more than the first prompt alone.
    assert after_hits - hits == (prompt + generated - 1) // 16 * 16 > prompt // 16 * 16


async def test_with_prefix_caching_off_the_counters_stay_at_zero():
    sim = start_simulator(
        "serve", "acme/nocache", "--no-enable-prefix-caching", "--time-to-first-token", "1"
    )
    try:
        prompt = " ".join(f"fog{i}" for i in range(50))
        for _ in range(2):
            assert await complete_and_count(sim, "acme/nocache", prompt, "acme/nocache") == (0, 0)
        assert await prefix_cache(sim, "acme/nocache") == (0, 0)
    finally:
        sim.stop()


async def test_the_block_size_flag_sets_the_prefix_caches_unit():
    # The block size of vLLM's CPU backend.
    sim = start_simulator("serve", "acme/cpu", "--block-size", "128", "--time-to-first-token", "1")
    try:
        prompt = " ".join(f"tide{i}" for i in range(300))
        assert await complete_and_count(sim, "acme/cpu", prompt, "acme/cpu") == (300, 0)
        assert await complete_and_count(sim, "acme/cpu", prompt, "acme/cpu") == (300, 256)
    finally:
        sim.stop()


def test_the_prefix_cache_is_bounded_and_evicts_a_prompts_tail_before_its_head():
    cache = PrefixCache(block_size=2, capacity=4)
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], lora=None)
    assert cache.hit_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9], lora=None) == 8
    cache.store([20, 21, 22, 23], lora=None)  # two blocks over the capacity: two go
    # The last blocks go first, as vLLM frees a request's blocks tail first: the shared head stays.
    assert cache.hit_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9], lora=None) == 4
    assert cache.hit_tokens([20, 21, 22, 23, 24], lora=None) == 4
    assert cache.hit_tokens([20, 21, 22, 23, 24], lora="sql") == 0


# -- LoRA adapters at runtime ------------------------------------------------------------------


async def test_adapters_load_and_unload_at_runtime_like_vllm(simulator):
    status, text = await post(
        simulator, "/v1/load_lora_adapter", {"lora_name": "support", "lora_path": "/a/support"}
    )
    assert (status, text) == (200, "Success: LoRA adapter 'support' added successfully.")
    async with sdk(simulator) as client:
        cards = {card.id: card for card in (await client.models.list()).data}
        assert (cards["support"].root, cards["support"].parent) == ("/a/support", "base")
        response = await client.chat.completions.create(
            model="support", messages=STORY, max_tokens=3
        )
        assert response.model == "support"

        status, again = await post(
            simulator, "/v1/load_lora_adapter", {"lora_name": "support", "lora_path": "/b"}
        )
        assert status == 400 and "has already been loaded" in again["error"]["message"]
        status, missing = await post(simulator, "/v1/load_lora_adapter", {"lora_name": "x"})
        assert status == 400 and missing["error"]["type"] == "InvalidUserInput"

        status, text = await post(simulator, "/v1/unload_lora_adapter", {"lora_name": "support"})
        assert (status, text) == (200, "Success: LoRA adapter 'support' removed successfully.")
        status, unknown = await post(simulator, "/v1/unload_lora_adapter", {"lora_name": "support"})
        assert status == 404 and unknown["error"]["type"] == "NotFoundError"
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="support", messages=STORY, max_tokens=3)


async def test_runtime_adapter_routes_do_not_exist_without_the_vllm_env_var(echo_simulator):
    status, body = await post(
        echo_simulator, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}
    )
    assert (status, body) == (404, {"detail": "Not Found"})


# -- fault injection ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fault", ["connect-close", "before-first-token", "hang"])
async def test_connection_faults_reach_the_client_as_connection_errors(simulator, fault, stream):
    received = []
    async with sdk(simulator, timeout=1.0) as client:
        with pytest.raises(openai.APIConnectionError):
            response = await client.chat.completions.create(
                model="base",
                messages=STORY,
                max_tokens=5,
                stream=stream,
                extra_headers={"X-Sim-Fail": fault},
            )
            if stream:
                async for chunk in response:
                    received.append(chunk)
    assert received == []


async def test_a_500_fault_is_an_internal_server_error(simulator):
    async with sdk(simulator) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(
                model="base", messages=STORY, extra_headers={"X-Sim-Fail": "500"}
            )
    assert info.value.body["type"] == "InternalServerError"


async def test_a_429_fault_is_a_rate_limit_error_with_retry_after(simulator):
    async with sdk(simulator) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.completions.create(
                model="base", prompt="hi", extra_headers={"X-Sim-Fail": "429"}
            )
    assert info.value.response.headers["retry-after"] == "1"


async def test_a_mid_stream_fault_sends_some_tokens_then_an_error_event(simulator):
    received = []
    async with sdk(simulator) as client:
        with pytest.raises(openai.APIError) as info:
            stream = await client.chat.completions.create(
                model="base",
                messages=STORY,
                max_tokens=20,
                stream=True,
                extra_headers={"X-Sim-Fail": "mid-stream"},
            )
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content)
    assert not isinstance(info.value, (openai.APIConnectionError, openai.APIStatusError))
    assert "".join(filter(None, received))  # some text came before the failure
    assert info.value.body["type"] == "InternalServerError"


async def test_after_faults_no_slot_is_left_taken(simulator):
    samples = await metrics(simulator)
    assert sample(samples, "vllm:num_requests_running", model_name="base") == 0
    assert sample(samples, "vllm:num_requests_waiting", model_name="base") == 0


async def test_a_failure_rate_of_one_fails_every_request_with_some_fault():
    sim = start_simulator("serve", "acme/flaky", "--failure-injection-rate", "1", "--seed", "3")
    try:
        async with sdk(sim, timeout=0.5) as client:
            results = await asyncio.gather(
                *[
                    client.chat.completions.create(messages=STORY, model="acme/flaky", max_tokens=3)
                    for _ in range(8)
                ],
                return_exceptions=True,
            )
    finally:
        sim.stop()
    assert all(isinstance(result, openai.APIError) for result in results)
    assert any("injecting fault" in line for line in sim.output)


# -- continuous batching, queueing, disconnects ----------------------------------------------------


async def test_concurrent_requests_share_decode_steps_instead_of_queueing(paced_simulator):
    async with sdk(paced_simulator) as client:

        async def one() -> None:
            chunks = await stream_chat(client, model="acme/paced", messages=STORY, max_tokens=40)
            assert chunks[-1].choices[0].finish_reason == "length"

        start = time.monotonic()
        await one()
        single = time.monotonic() - start
        start = time.monotonic()
        await asyncio.gather(one(), one())
        double = time.monotonic() - start
    assert single > 0.7  # 20 ms to the first token, then 39 steps of 20 ms
    assert double < 1.5 * single


async def test_requests_beyond_max_num_seqs_wait_for_a_slot(paced_simulator):
    waiting_seen = []
    async with sdk(paced_simulator) as client:

        async def one() -> int:
            response = await client.chat.completions.create(
                model="acme/paced", messages=STORY, max_tokens=15
            )
            return response.usage.completion_tokens

        requests = asyncio.gather(*[one() for _ in range(4)])
        while not requests.done():
            samples = await metrics(paced_simulator)
            waiting_seen.append(
                sample(samples, "vllm:num_requests_waiting", model_name="acme/paced")
            )
            await asyncio.sleep(0.03)
        assert await requests == [15, 15, 15, 15]
    assert 0 < max(waiting_seen) <= 2  # two run, the others wait their turn


async def test_a_client_that_disconnects_frees_its_slot_at_once(paced_simulator):
    async with sdk(paced_simulator) as client:
        before = await metrics(paced_simulator)
        stream = await client.chat.completions.create(
            model="acme/paced", messages=STORY, max_tokens=200, stream=True
        )
        async for chunk in stream:
            if chunk.choices[0].delta.content:
                break
        running = sample(
            await metrics(paced_simulator), "vllm:num_requests_running", model_name="acme/paced"
        )
        assert running == 1
        await stream.close()
        deadline = (
            time.monotonic() + 10
        )  # a wait, not a target: on a loaded machine the abort comes later
        while running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            after = await metrics(paced_simulator)
            running = sample(after, "vllm:num_requests_running", model_name="acme/paced")
    assert running == 0
    aborted = "vllm:request_success_total"
    labels = {"model_name": "acme/paced", "finished_reason": "abort"}
    assert sample(after, aborted, **labels) == sample(before, aborted, **labels) + 1


# -- process lifecycle and command line ----------------------------------------------------------


async def test_health_does_not_answer_until_the_startup_duration_is_over():
    port = free_port()
    process = launch_simulator(
        "serve",
        "acme/slow",
        "--startup-duration",
        "1.5",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    )
    sim = RunningSimulator(process=process, port=port)
    refused, status, body = 0, None, None
    start = time.monotonic()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() - start < 15:
                try:
                    async with session.get(sim.url + "/health") as response:
                        status, body = response.status, await response.read()
                        break
                except aiohttp.ClientConnectorError:
                    refused += 1
                    await asyncio.sleep(0.05)
        ready_after = time.monotonic() - start
    finally:
        sim.stop()
    assert refused > 0
    assert ready_after >= 1.3
    assert (status, body) == (200, b"")


def test_the_simulator_ignores_unmodelled_vllm_flags_and_logs_requests(simulator):
    output = "".join(simulator.output)
    assert "--gpu-memory-utilization 0.9" in output and "--quantization awq" in output
    assert re.search(r'"POST /v1/chat/completions HTTP/1.1" 200', output)


def test_a_value_after_an_unknown_flag_is_never_taken_for_the_model():
    served = parse_args(
        ["serve", "org/m", "--dtype", "auto", "--enable-prefix-caching", "--port", "9"], environ={}
    )
    assert (served.model, served.port) == ("org/m", 9)
    assert parse_args(["--dtype", "auto", "--model", "org/m"], environ={}).model == "org/m"
    config = parse_args(["--tensor-parallel-size", "2", "--max_model_len", "4K"], environ={})
    assert (config.model, config.max_model_len) == (DEFAULT_MODEL, 4096)


def test_lora_modules_parse_in_both_vllm_forms():
    as_json = '{"name": "b", "path": "/p/b", "base_model_name": "m"}'
    config = parse_args(
        ["serve", "m", "--enable-lora", "--lora-modules", "a=/p/a", as_json],
        environ={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )
    assert config.lora_modules == (LoraModule("a", "/p/a"), LoraModule("b", "/p/b", "m"))
    assert config.allow_runtime_lora_updating


def test_the_simulator_never_imports_django():
    code = (
        "import sys, inference_ops.simulator.server; "
        "sys.exit(any(m.startswith('django') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=30).returncode == 0
