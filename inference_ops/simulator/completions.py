"""The generation routes: /v1/chat/completions and /v1/completions, streamed as server-sent
events or answered whole, with the faults that strike during generation.

A request with n > 1 runs n sequences in the engine (vLLM fans it out into n child requests);
streamed, their chunks interleave as the engine's steps produce them, one choice per chunk.
The plain stream (one choice of text, no logprobs) keeps the cheap path of ChunkWriter.delta;
the rest is rendered choice by choice (responses.StreamedChoice).
"""

import asyncio
import json
import random
from dataclasses import dataclass

from aiohttp import web

from . import generation, structured, tools
from . import logprobs as lp
from .engine import Sequence, merged
from .faults import drop_connection, early_fault, pick_fault
from .http_json import json_body, json_response
from .protocol import (
    ENGINE_ERROR_MESSAGE,
    APIError,
    GenerationParams,
    context_length_error,
    parse_chat,
    parse_completion,
    suffix_error,
    vllm_error,
)
from .responses import (
    ChunkWriter,
    StreamedChoice,
    chat_choice,
    completion_choice,
    full_response,
    usage_info,
)
from .schema_instance import instance
from .state import SIM, Simulator
from .tokenizer import VOCAB_SIZE, token_ids, tokenize

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
_NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class Choice:
    seq: Sequence
    tool_call: tools.ToolCallPlan | None = None


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
    # The client's id (X-Request-Id, else the body's request_id) names the response, as in vLLM.
    base_id = request.headers.get("X-Request-Id") or params.request_id or tools.random_uuid()
    request_id = f"chatcmpl-{base_id}" if params.endpoint == "chat" else f"cmpl-{base_id}"
    model, choices = _plan(sim, params, request_id)
    # What vLLM's engine refuses when it takes the request in: a 400 before a whole answer, an
    # error event after the 200 of a stream.
    refusal = _engine_refusal(sim, params)
    if refusal is not None and not params.stream:
        raise refusal
    if fault == "before-first-token":
        # The engine dies during prefill: a stream has its 200 and headers, then nothing.
        if params.stream:
            await web.StreamResponse(headers=SSE_HEADERS).prepare(request)
        await asyncio.sleep(sim.config.ttft / 2)
        await drop_connection(request)
    # Where a mid-stream fault strikes: after a few tokens, always before the end.
    first = choices[0].seq
    fail_after = max(1, min(3, len(first.output.tokens) - 1)) if fault == "mid-stream" else None
    writer = ChunkWriter(
        endpoint=params.endpoint,
        model=model,
        request_id=request_id,
        fingerprint=sim.fingerprint,
        include_usage=params.include_usage,
    )
    if not params.stream:
        return await _complete(sim, params, writer, choices, fail_after)
    if refusal is not None:
        return await _refused_stream(request, writer, refusal)
    if params.plain and choices[0].tool_call is None:
        return await _stream(sim, request, params, writer, first, fail_after)
    return await _stream_choices(sim, request, params, writer, choices, fail_after)


def _echoed(params: GenerationParams) -> str:
    """What a completion with `echo` starts with: the prompt's text (a prompt of token ids has no
    text the simulator could give back: vLLM would detokenize it)."""
    if params.endpoint != "completion" or not params.echo:
        return ""
    return params.echo_text or ""


def _plan(sim: Simulator, params: GenerationParams, request_id: str) -> tuple[str, list[Choice]]:
    """Validate a parsed request against the server and plan the output of each choice."""
    model, lora = sim.resolve_model(params.model)
    if params.endpoint == "chat":
        tools.check_server(params.tools, parser=sim.config.tool_parser)
    elif (refused := suffix_error(params)) is not None:
        raise refused
    prompt_len = len(params.prompt_tokens)
    error = context_length_error(
        max_model_len=sim.config.max_model_len,
        prompt_tokens=prompt_len,
        max_tokens=params.max_tokens,
    )
    if error is not None:
        raise error
    call = None
    if sim.config.tool_parser is not None:
        call = tools.plan_call(
            params.tools,
            ends_with_tool_result=params.ends_with_tool_result,
            strict=sim.config.strict_tool_calling,
        )
    prompt_ids = token_ids(params.prompt_tokens)
    wake = asyncio.Event() if params.n > 1 else None
    choices = []
    for index in range(params.n):
        # vLLM seeds the n children of a seeded request with seed + index.
        seed = params.seed + index if params.seed is not None else sim.text_rng.getrandbits(64)
        rng = random.Random(seed)
        tool_call, content = None, None
        if call is not None or params.constraint is not None:
            filler = generation.filler_text(
                mode=sim.config.mode, rng=rng, echo_text=params.echo_text
            )
            if call is not None:
                name, schema, mode, wire = call
                arguments = json.dumps(
                    instance(schema or _NO_PARAMETERS, text=filler), ensure_ascii=False
                )
                tool_call = tools.ToolCallPlan(name=name, mode=mode, wire=wire, arguments=arguments)
                content = tool_call.tokens()
            elif (text := _structured_text(params.constraint, rng, filler, sim)) is not None:
                content = tokenize(text)
        output = generation.plan_output(
            mode=sim.config.mode,
            rng=rng,
            echo_text=params.echo_text,
            max_tokens=params.max_tokens,
            room=sim.config.max_model_len - prompt_len,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            content_tokens=content,
        )
        seq = Sequence(
            request_id=request_id if params.n == 1 else f"{index}_{request_id}",
            prompt_ids=prompt_ids,
            output=output,
            lora=lora,
            wake=wake,
        )
        choices.append(Choice(seq=seq, tool_call=tool_call))
    return model, choices


def _structured_text(constraint, rng: random.Random, filler: str, sim: Simulator) -> str | None:
    try:
        return structured.generate(constraint, rng=rng, text=filler, echo=sim.config.mode == "echo")
    except ValueError:
        return None  # a regex the engine refuses; _engine_refusal reports it


def _engine_refusal(sim: Simulator, params: GenerationParams) -> APIError | None:
    """vLLM's SamplingParams.verify, run by the engine's input processor."""
    if params.logprobs:  # 0 asks for the sampled token only: always allowed
        wanted = VOCAB_SIZE if params.logprobs == -1 else params.logprobs
        limit = VOCAB_SIZE if sim.config.max_logprobs == -1 else sim.config.max_logprobs
        if wanted > limit:
            return vllm_error(
                f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
                f"{limit}",
                parameter="logprobs",
                value=wanted,
            )
    try:
        structured.check_for_engine(params.constraint)
    except structured.EngineInputError as exc:
        return exc.error
    return None


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
    sim: Simulator, request, params, writer: ChunkWriter, seq: Sequence, fail_after: int | None
) -> web.StreamResponse:
    """The plain stream: one choice of text, only the token text encoded per chunk."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    sim.engine.submit(seq)
    sent = 0
    echo = _echoed(params)  # goes out with the first tokens, as vLLM sends it
    try:
        async for batch in seq.stream():
            if sent == 0 and writer.chat:
                await response.write(writer.roles())
            if fail_after is not None and sent + len(batch) >= fail_after:
                text = echo + "".join(batch[: fail_after - sent])
                if text:
                    await response.write(writer.delta(text))
                sim.engine.abort(seq)
                # vLLM reports an engine failure inside the stream as an error
                # event, then still ends the stream with [DONE].
                await response.write(writer.error())
                await response.write(writer.DONE)
                return response
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


async def _stream_choices(
    sim: Simulator, request, params, writer: ChunkWriter, choices: list[Choice], fail_after
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
    for seq in seqs:
        sim.engine.submit(seq)
    sent = 0
    try:
        async for index, start, end in merged(seqs):
            if sent == 0 and writer.chat:
                await response.write(writer.roles(len(seqs)))
            if fail_after is not None and sent + end - start >= fail_after:
                for seq in seqs:
                    sim.engine.abort(seq)
                await response.write(writer.error())
                await response.write(writer.DONE)
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
    sim: Simulator, params, writer: ChunkWriter, choices: list[Choice], fail_after: int | None
) -> web.Response:
    seqs = [choice.seq for choice in choices]
    for seq in seqs:
        sim.engine.submit(seq)
    try:
        if fail_after is not None:
            async for _ in seqs[0].stream():
                if seqs[0].generated >= fail_after:
                    break
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
