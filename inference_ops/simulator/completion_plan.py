"""A generation request planned before anything is sent: validated against the server (model,
tool parser, suffix, context window), each of its n choices given its output (text, a tool call,
structured output), and what vLLM's engine refuses when it takes the request in."""

import asyncio
import json
import random
from dataclasses import dataclass

from . import generation, structured, tools
from .engine import Sequence
from .protocol import APIError, GenerationParams, context_length_error, suffix_error, vllm_error
from .schema_instance import instance
from .state import Simulator
from .tokenizer import VOCAB_SIZE, token_ids, tokenize

_NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class Choice:
    seq: Sequence
    tool_call: tools.ToolCallPlan | None = None


def plan(sim: Simulator, params: GenerationParams, request_id: str) -> tuple[str, list[Choice]]:
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
            skip=params.prefill_tokens,
        )
        seq = Sequence(
            request_id=request_id if params.n == 1 else f"{index}_{request_id}",
            prompt_ids=prompt_ids,
            output=output,
            lora=lora,
            wake=wake,
            priority=params.priority,
        )
        choices.append(Choice(seq=seq, tool_call=tool_call))
    return model, choices


def _structured_text(constraint, rng: random.Random, filler: str, sim: Simulator) -> str | None:
    try:
        return structured.generate(constraint, rng=rng, text=filler, echo=sim.config.mode == "echo")
    except ValueError:
        return None  # a regex the engine refuses; engine_refusal reports it


def engine_refusal(sim: Simulator, params: GenerationParams) -> APIError | None:
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
