"""The generation routes: /v1/chat/completions and /v1/completions, streamed as server-sent
events or answered whole, with the faults that strike during generation."""

import asyncio
import random
import uuid

from aiohttp import web

from .engine import Sequence
from .faults import drop_connection, early_fault, pick_fault
from .generation import plan_output
from .http_json import json_body, json_response
from .protocol import (
    ENGINE_ERROR_MESSAGE,
    APIError,
    ChunkWriter,
    context_length_error,
    full_response,
    parse_chat,
    parse_completion,
)
from .state import SIM, Simulator
from .tokenizer import token_ids

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion)


async def _generate(request: web.Request, parse) -> web.StreamResponse:
    sim = request.app[SIM]
    raw = await request.read()  # read first, so a dropped connection closes cleanly
    fault = pick_fault(request)
    if (refused := await early_fault(request, fault)) is not None:
        return refused

    params = parse(json_body(request, raw))
    if sim.config.cross_encoder:
        api = "Chat Completions" if params.endpoint == "chat" else "Completions"
        raise APIError(f"The model does not support {api} API")
    model, seq = _new_sequence(sim, params)
    if fault == "before-first-token":
        # The engine dies during prefill: a stream has its 200 and headers, then nothing.
        if params.stream:
            await web.StreamResponse(headers=SSE_HEADERS).prepare(request)
        await asyncio.sleep(sim.config.ttft / 2)
        await drop_connection(request)
    # Where a mid-stream fault strikes: after a few tokens, always before the end.
    fail_after = max(1, min(3, len(seq.output.tokens) - 1)) if fault == "mid-stream" else None
    if params.stream:
        return await _stream(sim, request, params, model, seq, fail_after)
    return await _complete(sim, params, model, seq, fail_after)


def _new_sequence(sim: Simulator, params) -> tuple[str, Sequence]:
    """Validate a parsed request against the served models and plan its output."""
    model, lora = sim.resolve_model(params.model)
    prompt_len = len(params.prompt_tokens)
    error = context_length_error(
        max_model_len=sim.config.max_model_len,
        prompt_tokens=prompt_len,
        max_tokens=params.max_tokens,
    )
    if error is not None:
        raise error
    rng = random.Random(params.seed if params.seed is not None else sim.text_rng.getrandbits(64))
    output = plan_output(
        mode=sim.config.mode,
        rng=rng,
        echo_text=params.echo_text,
        max_tokens=params.max_tokens,
        room=sim.config.max_model_len - prompt_len,
        stop=params.stop,
        include_stop_str_in_output=params.include_stop_str_in_output,
    )
    return model, Sequence(
        request_id=uuid.uuid4().hex,
        prompt_ids=token_ids(params.prompt_tokens),
        output=output,
        lora=lora,
    )


async def _stream(
    sim: Simulator, request, params, model: str, seq: Sequence, fail_after: int | None
) -> web.StreamResponse:
    writer = ChunkWriter(endpoint=params.endpoint, model=model)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    sim.engine.submit(seq)
    sent = 0
    try:
        async for batch in seq.stream():
            if sent == 0 and params.endpoint == "chat":
                await response.write(writer.role())
            if fail_after is not None and sent + len(batch) >= fail_after:
                text = "".join(batch[: fail_after - sent])
                if text:
                    await response.write(writer.delta(text))
                sim.engine.abort(seq)
                # vLLM reports an engine failure inside the stream as an error
                # event, then still ends the stream with [DONE].
                await response.write(writer.error())
                await response.write(writer.DONE)
                return response
            sent += len(batch)
            text = "".join(batch)
            if seq.finished and not seq.aborted and sent == seq.generated:
                await response.write(writer.delta(text, seq.finish_reason, seq.output.stop_reason))
            elif text:
                await response.write(writer.delta(text))
        if params.include_usage:
            await response.write(writer.usage(seq.prompt_tokens, seq.generated))
        await response.write(writer.DONE)
    except ConnectionResetError:
        # The client left between two writes; the finally frees its slot.
        pass
    finally:
        sim.engine.abort(seq)  # a no-op when the sequence finished
    return response


async def _complete(
    sim: Simulator, params, model: str, seq: Sequence, fail_after: int | None
) -> web.Response:
    sim.engine.submit(seq)
    try:
        if fail_after is not None:
            async for _ in seq.stream():
                if seq.generated >= fail_after:
                    break
            sim.engine.abort(seq)
            raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
        await seq.wait_finished()
    finally:
        sim.engine.abort(seq)
    return json_response(
        full_response(
            endpoint=params.endpoint,
            model=model,
            text=seq.output.text,
            finish_reason=seq.output.finish_reason,
            stop_reason=seq.output.stop_reason,
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=seq.generated,
        )
    )
