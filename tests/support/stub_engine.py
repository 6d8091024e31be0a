"""An OpenAI-compatible engine whose stream is known to the byte, for relay tests.

It runs in a thread of its own (with its own event loop), so a daphne process started by
the tests and the tests themselves, sync or async, can all reach it. The model name picks
the behaviour:

- `burst`: `TOKENS` numbered tokens ("w0 ", "w1 ", …) written in irregular bursts: several
  events in one write, events cut in two across writes, some with CRLF line ends; then the
  finish chunk, the usage chunk and `[DONE]`. What a relay must pass on exactly, in order.
- `broken`: `BROKEN_AFTER` tokens, then an error event in the stream, then the end.
- `slow`: `SLOW_TOKENS` tokens, one every `SLOW_GAP` seconds: a stream that lasts.
- `quick`: three tokens, then the end.
- `Parrot` (an engine of its own): the last user message it was sent, three characters a chunk.
- a name in `SCRIPTS` (`toolcall`, `choices`, `refusal`): that script's chunks, written as vLLM
  writes such answers (tool-call deltas, several choices with logprobs, a refusal), with a
  `system_fingerprint` and usage details.

Every request body it received is kept, in order, in `StubEngine.received`: what the gateway
really sent an engine (its messages, its limits), for tests of the prompt.

`ApisRecorder` serves the two other APIs as well, answering as vLLM does: `/v1/completions`
(two chunks of text, the finish, `COMPLETION_USAGE`) and `/v1/embeddings` (`EMBEDDING_DIM`
numbers per input, float or base64), keeping what it receives in the same list.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import threading

from aiohttp import web

RECEIVED = web.AppKey("received", list)

TOKENS = 300
BROKEN_AFTER = 40
SLOW_TOKENS = 20
SLOW_GAP = 0.1
PROMPT_TOKENS = 7


def expected_text(count: int = TOKENS) -> str:
    return "".join(f"w{i} " for i in range(count))


def _event(payload: dict, crlf: bool = False) -> bytes:
    end = b"\r\n\r\n" if crlf else b"\n\n"
    return b"data: " + json.dumps(payload).encode() + end


def _chunk(model: str, content: str | None = None, finish: str | None = None) -> dict:
    delta = {"content": content} if content is not None else {}
    return {
        "id": "stub",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _choice(index: int, delta: dict, finish: str | None = None, logprobs=None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _logprob(token: str) -> dict:
    return {
        "token": token,
        "logprob": -0.25,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": token, "logprob": -0.25, "bytes": list(token.encode())}],
    }


def _tool_call(index: int, *, id=None, name=None, arguments=None) -> dict:
    call: dict = {"index": index}
    function = {}
    if id is not None:
        call.update(id=id, type="function")
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    call["function"] = function
    return {"tool_calls": [call]}


ROLE = {"role": "assistant", "content": ""}
# Each script: the choices of one chunk per line, as vLLM streams such an answer.
SCRIPTS = {
    "toolcall": [
        [_choice(0, ROLE)],
        [_choice(0, _tool_call(0, id="chatcmpl-tool-1", name="get_weather", arguments=""))],
        [_choice(0, _tool_call(0, arguments='{"city": '))],
        [_choice(0, _tool_call(0, arguments='"Paris"}'))],
        [_choice(0, _tool_call(1, id="chatcmpl-tool-2", name="get_time", arguments="{}"))],
        [_choice(0, {"content": ""}, "tool_calls")],
    ],
    "choices": [
        [_choice(0, ROLE)],
        [_choice(1, ROLE)],
        [_choice(0, {"content": "Hello"}, logprobs={"content": [_logprob("Hello")]})],
        [_choice(1, {"content": "Hi"}, logprobs={"content": [_logprob("Hi")]})],
        [_choice(0, {"content": " there"}, logprobs={"content": [_logprob(" there")]})],
        [_choice(1, {"content": ""}, "length")],
        [_choice(0, {"content": ""}, "stop")],
    ],
    "refusal": [
        [_choice(0, ROLE)],
        [_choice(0, {"refusal": "I can't help "})],
        [_choice(0, {"refusal": "with that."})],
        [_choice(0, {"content": ""}, "stop")],
    ],
}
SCRIPT_USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 9,
    "total_tokens": 29,
    "prompt_tokens_details": {"cached_tokens": 16},
}
FINGERPRINT = "fp_stub"


async def _script(request: web.Request, body: dict, model: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunks = [
        {
            "id": "stub",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }
        for choices in SCRIPTS[model]
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**chunks[0], "choices": [], "usage": SCRIPT_USAGE})
    stream = b"".join(_event(chunk) for chunk in chunks) + b"data: [DONE]\n\n"
    for position in range(0, len(stream), 97):  # events cut across writes
        await response.write(stream[position : position + 97])
        await asyncio.sleep(0.001)
    return response


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[RECEIVED].append(body)
    model = body["model"]
    if model in SCRIPTS:
        return await _script(request, body, model)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    rng = random.Random(11)
    if model == "quick":
        for i in range(3):
            await response.write(_event(_chunk(model, f"w{i} ")))
        count = 3
    elif model == "slow":
        for i in range(SLOW_TOKENS):
            await asyncio.sleep(SLOW_GAP)
            await response.write(_event(_chunk(model, f"w{i} ")))
        count = SLOW_TOKENS
    else:
        count = BROKEN_AFTER if model == "broken" else TOKENS
        stream = b"".join(
            _event(_chunk(model, f"w{i} "), crlf=rng.random() < 0.2) for i in range(count)
        )
        if model == "broken":  # the error shares its write with the last tokens
            stream += _event({"error": {"message": "the engine fell over", "type": "server_error"}})
        position = 0
        while position < len(stream):
            # Irregular writes: from a fragment of one event to a burst of many.
            size = rng.choice([7, 40, 150, 600, 2500]) if position else 2500
            await response.write(stream[position : position + size])
            position += size
            await asyncio.sleep(0.001)
        if model == "broken":
            return response
    await response.write(_event(_chunk(model, finish="length")))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": count,
            "total_tokens": PROMPT_TOKENS + count,
        }
        await response.write(
            _event(
                {
                    "id": "stub",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        )
    await response.write(b"data: [DONE]\n\n")
    return response


class StubEngine:
    def __init__(self):
        self.url = ""
        self.received: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="stub-engine")

    def start(self) -> StubEngine:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the stub engine did not start")
        return self

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """The chat completions handler; an engine with other manners overrides it."""
        return await _chat(request)

    def _routes(self, app: web.Application) -> None:
        """More routes than chat's (completions, embeddings): an engine that serves them adds
        them here."""

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app[RECEIVED] = self.received
        app.router.add_post("/v1/chat/completions", self._chat)
        self._routes(app)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        async def cleanup():
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class Parrot(StubEngine):
    """An engine that answers with the last user message it was sent, three characters a chunk
    (a placeholder arrives in pieces), and keeps every request body it got."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        said = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for at in range(0, len(said), 3):
            chunk = {"choices": [{"index": 0, "delta": {"content": said[at : at + 3]}}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0)
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await response.write(b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")
        return response


COMPLETION_USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
COMPLETION_TEXT = " rested."
EMBEDDING_DIM = 4


class ApisRecorder(StubEngine):
    """The stub engine with vLLM's completions and embeddings, keeping every request it gets."""

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", _completion)
        app.router.add_post("/v1/embeddings", _embeddings)


def _completion_chunk(model: str, text: str, finish: str | None = None) -> dict:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    return {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": 1,
        "model": model,
        "choices": [choice],
    }


async def _completion(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[RECEIVED].append(body)
    model = body["model"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    last = {**_completion_chunk(model, ""), "choices": [], "usage": COMPLETION_USAGE}
    await response.write(
        _event(_completion_chunk(model, COMPLETION_TEXT[:-1]))
        + _event(_completion_chunk(model, COMPLETION_TEXT[-1], finish="stop"))
        + _event(last)
        + b"data: [DONE]\n\n"
    )
    return response


async def _embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    request.app[RECEIVED].append(body)
    given = body["input"]
    inputs = [given] if isinstance(given, str) or isinstance(given[0], int) else given
    data = []
    for index, _ in enumerate(inputs):
        vector = [float(index + 1)] * EMBEDDING_DIM
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode()
        data.append({"index": index, "object": "embedding", "embedding": vector})
    tokens = 3 * len(inputs)
    return web.json_response(
        {
            "id": "embd-stub",
            "object": "list",
            "created": 1,
            "model": body["model"],
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
    )
