"""The generation routes: /v1/chat/completions and /v1/completions, streamed as server-sent
events or answered whole, with the faults that strike during generation.

A request with n > 1 runs n sequences in the engine (vLLM fans it out into n child requests);
streamed, their chunks interleave as the engine's steps produce them, one choice per chunk.
The plain stream (one choice of text, no logprobs) keeps the cheap path of ChunkWriter.delta;
the rest is rendered choice by choice (responses.StreamedChoice). What each choice will say, and
what the server or the engine refuses first, is planned in `completion_plan`.
"""

import asyncio
from dataclasses import dataclass

from aiohttp import web

from . import logprobs as lp
from . import tools
from .completion_plan import Choice, engine_refusal, plan
from .engine import Sequence, merged
from .faults import (
    HANG_SECONDS,
    Fault,
    drop_connection,
    early_fault,
    late_fault,
    pick_fault,
)
from .http_json import json_body, json_response
from .protocol import (
    ENGINE_ERROR_MESSAGE,
    APIError,
    GenerationParams,
    context_length_error,
    parse_chat,
    parse_completion,
)
from .responses import (
    ChunkWriter,
    StreamedChoice,
    chat_choice,
    completion_choice,
    full_response,
    usage_info,
)
from .state import SIM, Simulator

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion)


async def _generate(request: web.Request, parse) -> web.StreamResponse:
    sim = request.app[SIM]
    raw = await request.read()  # read first, so a dropped connection closes cleanly
    fault = pick_fault(request, sim, raw)
    if (refused := await early_fault(request, sim, fault)) is not None:
        return refused

    params = parse(json_body(request, raw))
    # The client's id (X-Request-Id, else the body's request_id) names the response, as in vLLM.
    base_id = request.headers.get("X-Request-Id") or params.request_id or tools.random_uuid()
    request_id = f"chatcmpl-{base_id}" if params.endpoint == "chat" else f"cmpl-{base_id}"
    if fault is not None and fault.kind == "context-length":
        _context_fault(sim, params, fault)
    model, choices = plan(sim, params, request_id)
    # What vLLM's engine refuses when it takes the request in: a 400 before a whole answer, an
    # error event after the 200 of a stream.
    refusal = engine_refusal(sim, params)
    if refusal is not None and not params.stream:
        raise refusal
    fault = late_fault(sim, fault, prefill=params.continue_final)
    if fault is not None and fault.kind == "before-first-token":
        # The engine dies during prefill: a stream has its 200 and headers, then nothing.
        if params.stream:
            await web.StreamResponse(headers=SSE_HEADERS).prepare(request)
        await asyncio.sleep(sim.config.ttft / 2)
        await drop_connection(request)
    first = choices[0].seq
    cut = _cut(fault, len(first.output.tokens))
    writer = ChunkWriter(
        endpoint=params.endpoint,
        model=model,
        request_id=request_id,
        fingerprint=sim.fingerprint,
        include_usage=params.include_usage,
    )
    if not params.stream:
        return await _complete(sim, request, params, writer, choices, cut)
    if refusal is not None:
        return await _refused_stream(request, writer, refusal)
    if params.plain and choices[0].tool_call is None:
        return await _stream(sim, request, params, writer, first, cut)
    return await _stream_choices(sim, request, params, writer, choices, cut)


@dataclass(frozen=True)
class Cut:
    """Where and how a stream fault strikes: after `after` content tokens (counted over the
    choices), or, for slow-first-token, `delay` seconds before the first."""

    kind: str
    after: int = 0
    how: str = "error"
    delay: float = 0.0

    def reached(self, tokens: int) -> bool:
        """Whether it strikes once `tokens` content tokens are out."""
        return self.kind != "slow-first-token" and tokens >= self.after


def _cut(fault: Fault | None, planned: int) -> Cut | None:
    if fault is None:
        return None
    if fault.kind == "slow-first-token":
        return Cut(kind=fault.kind, delay=fault.delay)
    # By default after a few tokens, always before the end.
    after = fault.after if fault.after is not None else max(1, min(3, planned - 1))
    return Cut(kind=fault.kind, after=after, how=fault.how)


def _context_fault(sim: Simulator, params: GenerationParams, fault: Fault) -> None:
    # The fault shrinks the model's window for this request: vLLM's 400 when the request does
    # not fit it, the request answered when it does.
    error = context_length_error(
        max_model_len=fault.max_model_len,
        prompt_tokens=len(params.prompt_tokens),
        max_tokens=params.max_tokens,
    )
    if error is not None and sim.faults.take(fault):
        raise error


async def _first_token_delay(cut: Cut | None) -> None:
    if cut is not None and cut.kind == "slow-first-token":
        await asyncio.sleep(cut.delay)


# One line a client cannot read: a chunk cut off inside its JSON.
MALFORMED_LINE = b'data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choices":[{\n\n'


def _echoed(params: GenerationParams) -> str:
    """What a completion with `echo` starts with: the prompt's text (a prompt of token ids has no
    text the simulator could give back: vLLM would detokenize it)."""
    if params.endpoint != "completion" or not params.echo:
        return ""
    return params.echo_text or ""


def _prompt_details(sim: Simulator, params: GenerationParams, seq: Sequence) -> dict | None:
    # vLLM reports them only with --enable-prompt-tokens-details; chat adds its cache writes and
    # the media placeholders by modality, completions only the cache hits.
    if not sim.config.enable_prompt_tokens_details:
        return None
    if params.endpoint != "chat":
        return {
            "cached_tokens": seq.cached_tokens,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        }
    return {
        "cached_tokens": seq.cached_tokens,
        "created_cache_tokens": seq.cache_created_tokens,
        "multimodal_tokens": dict(params.media_tokens) or None,
    }


def _usage(sim: Simulator, params: GenerationParams, choices: list[Choice]) -> dict:
    first = choices[0].seq
    generated = sum(choice.seq.generated for choice in choices)
    return usage_info(first.prompt_tokens, generated, _prompt_details(sim, params, first))


async def _refused_stream(request, writer: ChunkWriter, refusal: APIError) -> web.StreamResponse:
    # The stream's 200 went out before the engine looked at the request: the refusal is its
    # only event.
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    await response.write(writer.error(refusal.body()))
    await response.write(writer.DONE)
    return response


async def _stream(
    sim: Simulator, request, params, writer: ChunkWriter, seq: Sequence, cut: Cut | None
) -> web.StreamResponse:
    """The plain stream: one choice of text, only the token text encoded per chunk."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    await _first_token_delay(cut)
    sim.engine.submit(seq)
    sent = 0
    echo = _echoed(params)  # goes out with the first tokens, as vLLM sends it
    try:
        async for batch in seq.stream():
            if sent == 0 and writer.chat:
                await response.write(writer.roles())
            if (
                cut is not None
                and cut.kind != "slow-first-token"
                and sent + len(batch) >= cut.after
            ):
                head, batch = batch[: cut.after - sent], batch[cut.after - sent :]
                text, echo = echo + "".join(head), ""
                if text:
                    await response.write(writer.delta(text))
                sent += len(head)
                if cut.kind != "malformed":
                    sim.engine.abort(seq)
                    await _break_stream(request, response, cut)
                    return response
                await response.write(MALFORMED_LINE)
                cut = None  # then the stream goes on whole
            sent += len(batch)
            text, echo = echo + "".join(batch), ""
            if seq.finished and not seq.aborted and sent == seq.generated:
                await response.write(writer.delta(text, seq.finish_reason, seq.output.stop_reason))
            elif text:
                await response.write(writer.delta(text))
        if params.include_usage:
            await response.write(writer.usage(_usage(sim, params, [Choice(seq)])))
        await response.write(writer.DONE)
    except ConnectionResetError:
        # The client left between two writes; the finally frees its slot.
        pass
    finally:
        sim.engine.abort(seq)  # a no-op when the sequence finished
    return response


async def _break_stream(request, response: web.StreamResponse, cut: Cut) -> None:
    """How a stream fault ends a stream once its tokens are out."""
    if cut.kind == "mid-stream" and cut.how == "error":
        # vLLM reports an engine failure inside the stream as an error event, then still ends
        # the stream with [DONE].
        await response.write(ChunkWriter.error())
        await response.write(ChunkWriter.DONE)
    elif cut.kind == "mid-stream":
        await drop_connection(request)
    elif cut.kind == "stall":
        await asyncio.sleep(HANG_SECONDS)  # until the client gives up
        await drop_connection(request)
    # no-done: the response just ends, with neither a finish_reason nor [DONE].


async def _stream_choices(
    sim: Simulator, request, params, writer: ChunkWriter, choices: list[Choice], cut: Cut | None
) -> web.StreamResponse:
    """Every other stream: n choices, logprobs, tool calls."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    seqs = [choice.seq for choice in choices]
    streamed = [
        StreamedChoice(
            chat=writer.chat,
            index=index,
            output=choice.seq.output,
            tool_stream=(
                tools.ToolStream(choice.tool_call, choice.seq.output.text)
                if choice.tool_call is not None
                else None
            ),
            top_logprobs=params.logprobs,
            echo=_echoed(params),
        )
        for index, choice in enumerate(choices)
    ]
    await _first_token_delay(cut)
    for seq in seqs:
        sim.engine.submit(seq)
    sent = 0
    try:
        async for index, start, end in merged(seqs):
            if sent == 0 and writer.chat:
                await response.write(writer.roles(len(seqs)))
            # Off the plain path a fault strikes between chunks, once `after` tokens are out.
            if (
                cut is not None
                and cut.kind != "slow-first-token"
                and sent + end - start > cut.after
            ):
                if cut.kind == "malformed":
                    await response.write(MALFORMED_LINE)
                    cut = None
                else:
                    for seq in seqs:
                        sim.engine.abort(seq)
                    await _break_stream(request, response, cut)
                    return response
            sent += end - start
            seq = seqs[index]
            last = seq.finished and not seq.aborted and end == seq.generated
            choice = streamed[index].render(start, end, seq.finish_reason if last else None)
            if choice is not None:
                await response.write(writer.chunk(choice))
        if params.include_usage:
            await response.write(writer.usage(_usage(sim, params, choices)))
        await response.write(writer.DONE)
    except ConnectionResetError:
        pass
    finally:
        for seq in seqs:
            sim.engine.abort(seq)
    return response


async def _complete(
    sim: Simulator, request, params, writer: ChunkWriter, choices: list[Choice], cut: Cut | None
) -> web.Response:
    """A whole answer. Of the stream faults, mid-stream is a 500 (or a dropped connection) once
    `after` tokens are generated, a stall never answers; malformed and no-done, which spoil a
    stream's events, leave it whole."""
    seqs = [choice.seq for choice in choices]
    await _first_token_delay(cut)
    for seq in seqs:
        sim.engine.submit(seq)
    try:
        if cut is not None and cut.kind in ("mid-stream", "stall"):
            async for _ in seqs[0].stream():
                if seqs[0].generated >= cut.after:
                    break
            if cut.kind == "stall" or cut.how == "close":
                for seq in seqs:
                    sim.engine.abort(seq)
                if cut.kind == "stall":
                    await asyncio.sleep(HANG_SECONDS)
                await drop_connection(request)
            raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
        for seq in seqs:
            await seq.wait_finished()
    finally:
        for seq in seqs:
            sim.engine.abort(seq)
    top = params.logprobs
    bodies = []
    for index, choice in enumerate(choices):
        output = choice.seq.output
        if writer.chat:
            content, calls, reason = output.text, [], output.finish_reason
            if choice.tool_call is not None:
                content, calls, reason = tools.final_message(
                    choice.tool_call, output.text, output.finish_reason
                )
            bodies.append(
                chat_choice(
                    index=index,
                    content=content,
                    tool_calls=calls,
                    logprobs=None if top is None else lp.chat_content(output.tokens, 0, top),
                    finish_reason=reason,
                    stop_reason=output.stop_reason,
                )
            )
        else:
            bodies.append(
                completion_choice(
                    index=index,
                    text=_echoed(params) + output.text,
                    # The generated tokens' offsets count the echoed prompt before them (whose
                    # own logprobs the simulator does not model).
                    logprobs=(
                        None
                        if top is None
                        else lp.completion(output.tokens, 0, top, len(_echoed(params)))
                    ),
                    finish_reason=output.finish_reason,
                    stop_reason=output.stop_reason,
                )
            )
    return json_response(
        full_response(
            endpoint=params.endpoint,
            request_id=writer.request_id,
            model=writer.model,
            choices=bodies,
            usage=_usage(sim, params, choices),
            fingerprint=sim.fingerprint,
        )
    )
