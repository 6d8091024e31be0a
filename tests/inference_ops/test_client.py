"""The streaming client against real HTTP servers: the simulator, and a misbehaving stub."""

import asyncio
import contextlib
import gzip

import aiohttp
import pytest
from aiohttp import web

from inference_ops.client import Finish, Token, stream_chat
from inference_ops.endpoint_calls import EndpointConfig, pool_for
from inference_ops.exceptions import EngineError

from .simulator_process import start_simulator

ASK = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def sim():
    server = start_simulator(
        "serve",
        "acme/base",
        "--max-num-seqs",
        "2",
        "--time-to-first-token",
        "10",
        "--inter-token-latency",
        "10",
    )
    yield server
    server.stop()


def config_for(url: str, **overrides) -> EndpointConfig:
    return EndpointConfig(
        **{
            "name": "local",
            "base_url": f"{url}/v1",
            "model": "acme/base",
            "connect_timeout": 1,
            "first_token_timeout": 2,
            "idle_timeout": 2,
            "total_timeout": 20,
            **overrides,
        }
    )


async def collect(config, **kwargs):
    events = []
    async with contextlib.aclosing(stream_chat(config, ASK, **kwargs)) as stream:
        async for event in stream:
            events.append(event)
    return events


async def failure(config, **kwargs) -> tuple[EngineError, list]:
    events = []
    with pytest.raises(EngineError) as info:
        async with contextlib.aclosing(stream_chat(config, ASK, **kwargs)) as stream:
            async for event in stream:
                events.append(event)
    return info.value, events


async def running(sim) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{sim.url}/metrics") as response:
            text = await response.text()
    line = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


async def test_it_streams_tokens_then_a_finish_with_usage_and_timings(sim):
    events = await collect(config_for(sim.url), max_tokens=12)
    tokens, finish = events[:-1], events[-1]
    assert all(isinstance(t, Token) and t.text for t in tokens)
    assert isinstance(finish, Finish)
    assert finish.finish_reason == "length"
    assert finish.usage.completion_tokens == 12 and finish.usage.prompt_tokens > 0
    # One Token per network read, holding every chunk of the read: how many chunks share a read
    # (and how many tokens a chunk holds: an engine merges them for a reader that falls behind)
    # depends on the moment, but every chunk that said something is counted once.
    assert 1 <= len(tokens) <= finish.tokens == sum(t.chunks for t in tokens) <= 12
    # Text alone (vLLM's `"token_ids": null` says nothing): the relay's text path, no choices.
    assert all(t.choices is None for t in tokens)
    assert 0 < finish.ttft <= tokens[-1].elapsed <= finish.total


async def test_one_pooled_sdk_client_per_endpoint_is_reused(sim):
    config = config_for(sim.url)
    assert pool_for(config) is pool_for(config)
    assert pool_for(config) is not pool_for(config_for(sim.url, idle_timeout=3))


@pytest.mark.parametrize(
    ("fault", "kind", "retryable", "produced"),
    [
        ("500", "server_error", True, False),
        ("429", "rate_limited", True, False),
        ("connect-close", "connect", True, False),
        ("before-first-token", "stream_truncated", True, False),
        ("hang", "timeout_first_token", True, False),
        ("mid-stream", "stream_error", True, True),
    ],
)
async def test_each_engine_failure_becomes_one_typed_error(sim, fault, kind, retryable, produced):
    error, events = await failure(
        config_for(sim.url, first_token_timeout=1),
        max_tokens=40,
        extra_headers={"X-Sim-Fail": fault},
    )
    assert (error.kind, error.retryable, error.produced_tokens) == (kind, retryable, produced), (
        error
    )
    assert bool(events) == produced
    assert error.endpoint == "local"


async def test_a_refused_connection_is_a_retryable_connect_error():
    error, _ = await failure(config_for("http://127.0.0.1:1"))
    assert error.kind == "connect" and error.retryable and not error.produced_tokens


async def test_client_errors_are_not_retryable(sim):
    error, _ = await failure(config_for(sim.url, model="no-such-model"))
    assert (error.kind, error.status_code, error.retryable) == ("client_error", 404, False)
    # Over the engine's window: a 400 of its own kind, which a target with a larger one may take.
    error, _ = await failure(config_for(sim.url), max_tokens=100_000)
    assert (error.kind, error.status_code, error.retryable) == ("context_length", 400, False)
    assert "maximum context length" in str(error)


async def test_the_total_budget_ends_a_long_answer(sim):
    error, events = await failure(config_for(sim.url, total_timeout=0.3), max_tokens=200)
    assert error.kind == "timeout_total" and error.produced_tokens and events


async def test_cancelling_the_consumer_closes_the_upstream_stream(sim):
    config = config_for(sim.url)

    async def consume(started: asyncio.Event):
        async for _event in stream_chat(config, ASK, max_tokens=500):
            started.set()

    started = asyncio.Event()
    task = asyncio.create_task(consume(started))
    await asyncio.wait_for(started.wait(), 5)
    assert await running(sim) == 1
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for _ in range(50):
        if await running(sim) == 0:
            break
        await asyncio.sleep(0.02)
    assert await running(sim) == 0  # the engine stopped generating: its slot is free


# -- a misbehaving server, for what the simulator does not do --------------------------------------


@pytest.fixture
async def stub():
    """Serves /v1/chat/completions per `stub.mode`: malformed JSON, a stall between tokens, or a
    clean close."""
    state = {"mode": "malformed"}
    ended = asyncio.Event()  # set at teardown: a stalled answer lets go, and the server stops now

    async def chat(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = (
            b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        )
        if state["mode"] == "malformed":
            await response.write(chunk + b"data: {not json\n\n" + chunk)
            await response.write(
                b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
                b"data: [DONE]\n\n"
            )
        elif state["mode"] == "only-malformed":
            await response.write(b"data: {not json\n\n")
        elif state["mode"] == "stall":
            await response.write(chunk)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), 5)
        elif state["mode"] == "no-finish":
            await response.write(chunk)
            await response.write(b"data: [DONE]\n\n")
        return response

    async def gzipped(request):
        # An engine behind a proxy that compresses its stream.
        finish = (
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        )
        body = (
            b'data: {"choices":[{"index":0,"delta":{"content":"squeezed"},'
            b'"finish_reason":null}]}\n\n' + finish
        )
        return web.Response(
            body=gzip.compress(body),
            headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/gzip/v1/chat/completions", gzipped)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield state, f"http://127.0.0.1:{port}"
    ended.set()
    await runner.cleanup()


async def test_an_unreadable_chunk_is_skipped_and_counted_and_the_answer_goes_on(stub):
    _, url = stub
    events = await collect(config_for(url))
    assert "".join(e.text for e in events[:-1]) == "hihi"
    assert events[-1].finish_reason == "stop" and events[-1].skipped_chunks == 1


async def test_a_stream_of_nothing_readable_is_truncated_not_complete(stub):
    state, url = stub
    state["mode"] = "only-malformed"
    error, events = await failure(config_for(url))
    assert error.kind == "stream_truncated" and not error.produced_tokens and events == []


async def test_a_stall_between_tokens_is_an_idle_timeout(stub):
    state, url = stub
    state["mode"] = "stall"
    error, events = await failure(config_for(url, idle_timeout=0.3))
    assert error.kind == "timeout_idle" and error.produced_tokens and len(events) == 1


async def test_a_slow_consumer_is_not_an_engine_stall(sim):
    # The idle budget counts from the start of each read: time the caller spends with a token
    # (a slow client downstream) is not the engine's silence.
    events = []
    async with contextlib.aclosing(
        stream_chat(config_for(sim.url, idle_timeout=0.15), ASK, max_tokens=4)
    ) as stream:
        async for event in stream:
            events.append(event)
            await asyncio.sleep(0.3)
    assert isinstance(events[-1], Finish) and events[-1].finish_reason == "length"
    assert "".join(e.text for e in events[:-1])


async def test_a_cancel_during_a_read_stays_a_cancel_and_not_a_timeout(stub):
    state, url = stub
    state["mode"] = "stall"
    task = asyncio.create_task(collect(config_for(url, idle_timeout=3)))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_compressed_stream_is_decoded(stub):
    _, url = stub
    events = await collect(config_for(f"{url}/gzip"))
    assert [e.text for e in events[:-1]] == ["squeezed"] and events[-1].finish_reason == "stop"


async def test_a_stream_without_a_finish_reason_is_truncated(stub):
    state, url = stub
    state["mode"] = "no-finish"
    error, _ = await failure(config_for(url))
    assert error.kind == "stream_truncated" and error.produced_tokens


# -- a stream known to the byte --------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    from tests.support.stub_engine import StubEngine

    server = StubEngine().start()
    yield server
    server.stop()


async def test_chunks_read_together_leave_together_with_nothing_lost_reordered_or_doubled(engine):
    from tests.support.stub_engine import PROMPT_TOKENS, TOKENS, expected_text

    events = await collect(config_for(engine.url, model="burst"))
    tokens, finish = events[:-1], events[-1]
    assert "".join(t.text for t in tokens) == expected_text()
    assert sum(t.chunks for t in tokens) == finish.tokens == TOKENS
    assert len(tokens) < TOKENS  # bursts arrived as fewer, larger events
    assert (finish.finish_reason, finish.usage.prompt_tokens, finish.usage.completion_tokens) == (
        "length",
        PROMPT_TOKENS,
        TOKENS,
    )


async def test_an_error_event_mid_stream_keeps_what_came_before_it(engine):
    from tests.support.stub_engine import BROKEN_AFTER, expected_text

    error, events = await failure(config_for(engine.url, model="broken"))
    assert (error.kind, error.retryable, error.produced_tokens) == ("stream_error", True, True)
    assert "the engine fell over" in str(error)
    assert "".join(t.text for t in events) == expected_text(BROKEN_AFTER)
