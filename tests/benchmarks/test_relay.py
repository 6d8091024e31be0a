"""The bare relay (benchmarks.relay), the floor a gateway is compared with, over real HTTP."""

import json

import aiohttp
from aiohttp.test_utils import TestServer

from benchmarks.relay import relay_app
from benchmarks.servers import simulator

ASK = {
    "model": "bench/model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}


async def _events(url: str, body: dict) -> tuple[int, str, list]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=20)
        ) as response:
            text = await response.text()
            return (
                response.status,
                response.headers.get("Content-Type", ""),
                [line[6:] for line in text.split("\n") if line.startswith("data: ")],
            )


async def test_the_relay_passes_the_engines_stream_and_its_errors_through():
    with simulator(
        args=["--max-num-seqs", "4", "--time-to-first-token", "5", "--inter-token-latency", "2"],
        model="bench/model",
    ) as engine:
        server = TestServer(relay_app(engine))
        await server.start_server()
        try:
            relay = str(server.make_url("")).rstrip("/")
            status, content_type, events = await _events(relay, ASK)
            assert status == 200 and content_type.startswith("text/event-stream")
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert "".join(
                c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
            )
            assert chunks[-1]["usage"]["completion_tokens"] == 5
            # What the engine refuses reaches the client as the engine said it.
            status, _, _ = await _events(relay, {**ASK, "model": "no-such-model"})
            assert status == 404
        finally:
            await server.close()
