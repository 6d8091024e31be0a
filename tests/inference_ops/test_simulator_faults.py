"""The simulator's fault grammar and its prefill continuation (`continue_final_message`), over
real HTTP: each fault named by the X-Sim-Fail header or by a model's --fault, seen from the
client's side."""

import asyncio
import json

import aiohttp
import openai
import pytest

from inference_ops.simulator.cli import parse_args
from inference_ops.simulator.faults import parse_spec

from .simulator_process import RunningSimulator, start_simulator
from .test_simulator import HTTP_TIMEOUT, post, sdk

STORY = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
SEED = 11
LENGTH = 12  # tokens in every seeded answer here


@pytest.fixture(scope="module")
def faulty():
    sim = start_simulator(
        "serve",
        "acme/faulty",
        "--served-model-name",
        "base",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "2",
        "--fault",
        "m-twice=500;times=2",
        "--fault",
        "m-twice-too=500;times=2",
        "--fault",
        "m-reset=connect-close",
        "--fault",
        "m-context=context-length",
        "--fault",
        "m-prefill=no-prefill",
        "--fault",
        "m-flap=flap;down=0.5;up=60",
    )
    yield sim
    sim.stop()


def seeded(**body) -> dict:
    return {"model": "base", "messages": STORY, "seed": SEED, "max_tokens": LENGTH, **body}


async def reference(sim: RunningSimulator) -> tuple[list[str], dict]:
    """The seeded answer without a fault: its tokens (the simulator's tokens are words with their
    leading space, or punctuation) and its usage."""
    status, body = await post(sim, "/v1/chat/completions", seeded())
    assert status == 200, body
    text = body["choices"][0]["message"]["content"]
    status, tokens = await post(
        sim, "/tokenize", {"model": "base", "prompt": text, "return_token_strs": True}
    )
    assert status == 200 and len(tokens["token_strs"]) == LENGTH
    return tokens["token_strs"], body["usage"]


async def raw_stream(
    sim: RunningSimulator, body: dict, headers: dict | None = None, read_timeout: float = 10
) -> tuple[list, BaseException | None]:
    """The `data:` lines of a streamed chat as the client reads them (JSON decoded where it
    decodes, else the raw line), and what broke the stream, if anything did."""
    events: list = []
    timeout = aiohttp.ClientTimeout(total=30, sock_read=read_timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(
                sim.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers
            ) as response:
                assert response.status == 200, await response.text()
                async for line in response.content:
                    text = line.decode().strip()
                    if not text.startswith("data: "):
                        continue
                    data = text[len("data: ") :]
                    try:
                        events.append(data if data == "[DONE]" else json.loads(data))
                    except ValueError:
                        events.append(text)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return events, exc
    return events, None


def content(events: list) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for event in events
        if isinstance(event, dict) and "choices" in event
        for choice in event["choices"]
    )


def finish_reasons(events: list) -> list:
    return [
        choice["finish_reason"]
        for event in events
        if isinstance(event, dict) and "choices" in event
        for choice in event["choices"]
        if choice.get("finish_reason")
    ]


# -- the grammar -----------------------------------------------------------------------------------


def test_a_spec_parses_its_keys_and_refuses_what_its_fault_does_not_take():
    fault = parse_spec("mid-stream;after=4;how=error;times=2")
    assert (fault.kind, fault.after, fault.how, fault.times) == ("mid-stream", 4, "error", 2)
    # mid-stream as it always was sends the error event; with after=N it cuts the connection.
    assert parse_spec("mid-stream").how == "error"
    assert parse_spec("mid-stream;after=4").how == "close"
    assert parse_spec("429").retry_after == "1"
    assert parse_spec("429;retry-after=none").retry_after is None
    assert parse_spec("503").retry_after is None
    assert parse_spec("500").times is None  # every request
    for bad, why in [
        ("teapot", "unknown fault"),
        ("500;after=3", "takes no 'after'"),
        ("stall;after=x", "not a number"),
        ("500;times=0", "at least 1"),
        ("mid-stream;how=slowly", "expected error or close"),
        ("429;retry-after", "not key=value"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_spec(bad)


def test_a_bad_fault_flag_stops_the_simulator_at_start():
    with pytest.raises(SystemExit):
        parse_args(["serve", "acme/x", "--fault", "m=stall;after=-1"])
    with pytest.raises(SystemExit):
        parse_args(["serve", "acme/x", "--fault", "no-model-given"])
    config = parse_args(["serve", "acme/x", "--fault", "a=500", "--fault", "b=429;times=1"])
    assert config.faults == (("a", "500"), ("b", "429;times=1"))


async def test_a_bad_header_is_a_400_that_says_why(faulty):
    status, body = await post(
        faulty, "/v1/chat/completions", seeded(), headers={"X-Sim-Fail": "stall;after=soon"}
    )
    assert status == 400
    assert "X-Sim-Fail" in body["error"]["message"]
    assert "not a number" in body["error"]["message"]


async def test_the_models_of_faults_are_served_under_their_own_names(faulty):
    async with sdk(faulty) as client:
        listed = {model.id async for model in client.models.list()}
        answer = await client.chat.completions.create(
            model="m-prefill", messages=STORY, max_tokens=3
        )
    assert {"base", "m-twice", "m-reset", "m-context", "m-prefill", "m-flap"} <= listed
    assert answer.model == "m-prefill"


# -- status faults ---------------------------------------------------------------------------------


async def test_times_strikes_the_first_requests_then_lets_them_through(faulty):
    statuses = []
    for _ in range(3):
        status, _ = await post(faulty, "/v1/chat/completions", seeded(model="m-twice"))
        statuses.append(status)
    assert statuses == [500, 500, 200]
    # Another model given the same SPEC has a count of its own.
    status, _ = await post(faulty, "/v1/chat/completions", seeded(model="m-twice-too"))
    assert status == 500
    # Counted per SPEC: a header with another SPEC has its own count.
    headers = {"X-Sim-Fail": "500;times=1"}
    first, _ = await post(faulty, "/v1/chat/completions", seeded(), headers=headers)
    second, _ = await post(faulty, "/v1/chat/completions", seeded(), headers=headers)
    assert (first, second) == (500, 200)


async def test_a_503_is_service_unavailable_with_retry_after_only_when_asked(faulty):
    async with sdk(faulty) as client:
        with pytest.raises(openai.InternalServerError) as plain:
            await client.chat.completions.create(**seeded(), extra_headers={"X-Sim-Fail": "503"})
        with pytest.raises(openai.InternalServerError) as told:
            await client.chat.completions.create(
                **seeded(), extra_headers={"X-Sim-Fail": "503;retry-after=4"}
            )
    assert plain.value.status_code == told.value.status_code == 503
    assert "retry-after" not in plain.value.response.headers
    assert told.value.response.headers["retry-after"] == "4"


@pytest.mark.parametrize(
    ("spec", "header"), [("429;retry-after=3", "3"), ("429;retry-after=none", None)]
)
async def test_a_429_sends_the_retry_after_it_is_given_or_none(faulty, spec, header):
    async with sdk(faulty) as client:
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(**seeded(), extra_headers={"X-Sim-Fail": spec})
    assert info.value.response.headers.get("retry-after") == header


async def test_a_models_connect_close_resets_before_any_header(faulty):
    async with sdk(faulty) as client:
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(**seeded(model="m-reset"))


async def test_a_content_filter_refusal_carries_its_code_and_reason(faulty):
    async with sdk(faulty) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                **seeded(), extra_headers={"X-Sim-Fail": "content-filter;reason=self-harm"}
            )
    assert info.value.code == "content_filter"
    assert "self-harm" in info.value.message


async def test_context_length_refuses_a_request_over_its_window_as_vllm_does(faulty):
    status, body = await post(faulty, "/v1/chat/completions", seeded(model="m-context"))
    assert status == 400
    assert body["error"]["type"] == "BadRequestError"
    assert body["error"]["message"].startswith("This model's maximum context length is 16 tokens.")
    # A window the request fits is no refusal.
    status, _ = await post(
        faulty,
        "/v1/chat/completions",
        seeded(),
        headers={"X-Sim-Fail": "context-length;max-model-len=4096"},
    )
    assert status == 200


async def test_a_flapping_model_fails_while_down_then_answers_while_up(faulty):
    first, body = await post(faulty, "/v1/chat/completions", seeded(model="m-flap"))
    assert first == 500 and body["error"]["type"] == "InternalServerError"
    await asyncio.sleep(0.7)  # past the 0.5 s down, well within the 60 s up
    second, _ = await post(faulty, "/v1/chat/completions", seeded(model="m-flap"))
    assert second == 200


# -- stream faults ---------------------------------------------------------------------------------


async def test_a_slow_first_token_outlasts_a_short_read_timeout_and_then_answers_whole(faulty):
    tokens, _ = await reference(faulty)
    headers = {"X-Sim-Fail": "slow-first-token;delay=1.5"}
    events, error = await raw_stream(faulty, seeded(), headers, read_timeout=0.5)
    assert error is not None and content(events) == ""
    events, error = await raw_stream(faulty, seeded(), headers)
    assert error is None
    assert content(events) == "".join(tokens)
    assert events[-1] == "[DONE]"


async def test_mid_stream_after_n_sends_n_tokens_then_vllms_error_event(faulty):
    tokens, _ = await reference(faulty)
    spec = "mid-stream;after=4;how=error"
    events, error = await raw_stream(faulty, seeded(), {"X-Sim-Fail": spec})
    assert error is None
    assert content(events) == "".join(tokens[:4])
    assert events[-2]["error"]["type"] == "InternalServerError"
    assert events[-1] == "[DONE]"
    assert finish_reasons(events) == []


async def test_mid_stream_closed_drops_the_connection_after_n_tokens(faulty):
    tokens, _ = await reference(faulty)
    events, error = await raw_stream(faulty, seeded(), {"X-Sim-Fail": "mid-stream;after=5"})
    assert isinstance(error, aiohttp.ClientPayloadError)
    assert content(events) == "".join(tokens[:5])
    assert "[DONE]" not in events


async def test_a_stall_stops_sending_after_n_tokens_and_holds_the_connection(faulty):
    tokens, _ = await reference(faulty)
    events, error = await raw_stream(
        faulty, seeded(), {"X-Sim-Fail": "stall;after=3"}, read_timeout=1.0
    )
    assert isinstance(error, TimeoutError)  # the client's read timeout, not the server's close
    assert content(events) == "".join(tokens[:3])


async def test_a_malformed_chunk_is_one_unreadable_line_in_a_whole_stream(faulty):
    tokens, usage = await reference(faulty)
    events, error = await raw_stream(
        faulty,
        seeded(stream_options={"include_usage": True}),
        {"X-Sim-Fail": "malformed;after=2"},
    )
    assert error is None
    unreadable = [event for event in events if isinstance(event, str) and event != "[DONE]"]
    assert len(unreadable) == 1
    assert content(events) == "".join(tokens)  # nothing lost, nothing repeated
    assert finish_reasons(events) == ["length"]
    assert events[-2]["usage"]["completion_tokens"] == usage["completion_tokens"]
    assert events[-1] == "[DONE]"


async def test_no_done_ends_the_response_cleanly_without_finish_reason_or_done(faulty):
    tokens, _ = await reference(faulty)
    events, error = await raw_stream(
        faulty, seeded(stream_options={"include_usage": True}), {"X-Sim-Fail": "no-done;after=6"}
    )
    assert error is None  # the HTTP response itself ended normally
    assert content(events) == "".join(tokens[:6])
    assert finish_reasons(events) == []
    assert "[DONE]" not in events
    assert not any(isinstance(e, dict) and e.get("usage") for e in events)


async def test_stream_faults_strike_off_the_plain_path_too(faulty):
    # n = 2 takes the rendering of every other stream (choices, logprobs, tool calls).
    events, error = await raw_stream(faulty, seeded(n=2), {"X-Sim-Fail": "no-done;after=4"})
    assert error is None and "[DONE]" not in events and finish_reasons(events) == []
    events, error = await raw_stream(faulty, seeded(n=2), {"X-Sim-Fail": "malformed;after=4"})
    assert error is None and events[-1] == "[DONE]"
    assert finish_reasons(events) == ["length", "length"]


# -- prefill: continue_final_message ---------------------------------------------------------------


def continuation(tokens: list[str], cut: int, **body) -> dict:
    fields = {
        "messages": [*STORY, {"role": "assistant", "content": "".join(tokens[:cut])}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": LENGTH - cut,
    }
    return seeded(**{**fields, **body})


async def test_a_continued_answer_is_only_the_rest_and_the_prefill_counts_as_prompt(faulty):
    tokens, usage = await reference(faulty)
    status, body = await post(faulty, "/v1/chat/completions", continuation(tokens, 5))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "".join(tokens[5:])
    assert body["usage"]["completion_tokens"] == LENGTH - 5
    # The answer's header stays (the message is left open) and the 5 prefill tokens join it.
    assert body["usage"]["prompt_tokens"] == usage["prompt_tokens"] + 5


async def test_a_continued_stream_gives_the_rest_of_the_same_answer(faulty):
    tokens, _ = await reference(faulty)
    events, error = await raw_stream(faulty, continuation(tokens, 7))
    assert error is None
    assert content(events) == "".join(tokens[7:])
    assert finish_reasons(events) == ["length"]


async def test_continue_final_message_is_refused_as_vllm_refuses_it(faulty):
    tokens, _ = await reference(faulty)
    both = continuation(tokens, 3, add_generation_prompt=True)
    status, body = await post(faulty, "/v1/chat/completions", both)
    assert (status, body["error"]["type"]) == (400, "BadRequestError")
    assert body["error"]["message"] == (
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    )
    from_user = seeded(continue_final_message=True, add_generation_prompt=False)
    status, body = await post(faulty, "/v1/chat/completions", from_user)
    assert status == 400
    assert body["error"]["message"] == (
        "Cannot set `continue_final_message` to True when the last message is not from the "
        "assistant."
    )


async def test_no_prefill_refuses_only_the_continuations(faulty):
    tokens, _ = await reference(faulty)
    status, body = await post(
        faulty, "/v1/chat/completions", continuation(tokens, 4, model="m-prefill")
    )
    assert status == 400
    assert body["error"]["message"].startswith("continue_final_message is set but the final")
    status, _ = await post(faulty, "/v1/chat/completions", seeded(model="m-prefill"))
    assert status == 200


async def test_after_faults_no_slot_is_left_taken(faulty):
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        async with session.get(faulty.url + "/metrics") as response:
            text = await response.text()
    running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    assert running and all(line.endswith(" 0.0") for line in running)
