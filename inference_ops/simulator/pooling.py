"""The pooling routes: /v1/embeddings, and /rerank and /score, by a cross-encoder or by the
cosine of an embedding model's vectors."""

import asyncio
import time
import uuid

from aiohttp import web

from . import embeddings as sim_embeddings
from . import scoring
from .faults import HANG_SECONDS, drop_connection, early_fault, late_fault, pick_fault
from .http_json import json_body, json_response
from .protocol import ENGINE_ERROR_MESSAGE, APIError, usage, validation_error, vllm_error
from .scoring_protocol import (
    pair_length_error,
    parse_rerank,
    parse_score,
    rerank_response,
    score_pairs,
    score_response,
)
from .state import SIM
from .tokenizer import tokenize


async def embeddings(request: web.Request) -> web.Response:
    """vLLM's /v1/embeddings (EmbeddingCompletionRequest): texts or token ids in, one vector per
    input, float or base64; the route exists for an embedding model only (server.make_app). The
    faults that strike before a request is handled apply (a drop, a hang, an error status)."""
    sim = request.app[SIM]
    raw = await request.read()
    if (refused := await early_fault(request, sim, pick_fault(request, sim, raw))) is not None:
        return refused
    body = json_body(request, raw)
    if not isinstance(body, dict):
        raise validation_error("body", "Input should be a valid dictionary", "dict_type")
    model, _ = sim.resolve_model(body.get("model"), pooling=True)
    inputs = _embedding_inputs(body.get("input", _MISSING))
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ("float", "base64"):
        raise validation_error(
            "encoding_format", "Input should be 'float' or 'base64'", "literal_error"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise validation_error(
                "dimensions", "Input should be a valid integer", "int_type", dimensions
            )
        # PoolingParams' check: a model that is not Matryoshka keeps its own size (the
        # simulated vectors are feature hashes, whose prefixes are no smaller embedding).
        raise vllm_error(
            f"Model {sim.served_names[0]!r} does not support Matryoshka embeddings; dimensions "
            f"must be unset (received dimensions={dimensions})."
        )
    prompt_tokens = 0
    data = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            count, text = len(tokenize(item)), item
        else:
            count, text = len(item), " ".join(map(str, item))
        if count > sim.config.max_model_len:
            raise APIError(
                "This model's maximum context length is "
                f"{sim.config.max_model_len} tokens. However, you requested {count} "
                "tokens in the input for embedding generation. Please reduce the length of "
                "the input.",
                param="input",
            )
        prompt_tokens += count
        vector = sim_embeddings.embed(text, sim.config.embedding_dim)
        data.append(
            {
                "index": index,
                "object": "embedding",
                "embedding": sim_embeddings.encode(vector, encoding_format),
            }
        )
    return json_response(
        {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage(prompt_tokens, 0),
        }
    )


_MISSING = object()


def _embedding_inputs(value) -> list:
    """The inputs of `input`, as vLLM's request takes it: a string, a list of strings, token ids,
    or a list of token-id lists."""
    if value is _MISSING:
        raise validation_error("input", "Field required", "missing")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return [value]
        if all(isinstance(t, str) for t in value):
            return value
        if all(
            isinstance(ids, list)
            and ids
            and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
            for ids in value
        ):
            return value
    raise validation_error(
        "input",
        "Input should be a valid string, a list of strings, or token ids",
        "string_type",
        value,
    )


async def rerank(request: web.Request) -> web.Response:
    return await _score(request, parse_rerank)


async def score(request: web.Request) -> web.Response:
    return await _score(request, parse_score)


async def _score(request: web.Request, parse) -> web.Response:
    """/rerank and /score: every pair in one forward pass, which takes --time-to-first-token (a
    pooling model only prefills). The faults of a request apply as to a generation that is not
    streamed: a drop or a 500 during the pass."""
    sim = request.app[SIM]
    raw = await request.read()
    fault = pick_fault(request, sim, raw)
    if (refused := await early_fault(request, sim, fault)) is not None:
        return refused
    params = parse(json_body(request, raw))
    model, _ = sim.resolve_model(params.model, pooling=True)
    pairs = score_pairs(params)
    tokens = 0
    for one, two in pairs:
        count = len(tokenize(one)) + len(tokenize(two)) + scoring.PAIR_SPECIAL_TOKENS
        error = pair_length_error(
            max_model_len=sim.config.max_model_len, tokens=count, endpoint=params.endpoint
        )
        if error is not None:
            raise error
        tokens += count
    fault = late_fault(sim, fault, prefill=False)
    kind = fault.kind if fault is not None else None
    if kind == "before-first-token":
        await asyncio.sleep(sim.config.ttft / 2)
        await drop_connection(request)
    if kind == "slow-first-token":
        await asyncio.sleep(fault.delay)  # type: ignore[union-attr]  # kind is set only with a fault
    await asyncio.sleep(sim.config.ttft)
    if kind == "stall":
        await asyncio.sleep(HANG_SECONDS)
        await drop_connection(request)
    if kind == "mid-stream":
        if fault.how == "close":  # type: ignore[union-attr]  # kind is set only with a fault
            await drop_connection(request)
        raise APIError(ENGINE_ERROR_MESSAGE, err_type="InternalServerError", status=500)
    if sim.config.cross_encoder:
        scores = [scoring.cross_encoder_score(one, two) for one, two in pairs]
    else:
        # An embedding model scores a pair by the cosine of its two vectors, as vLLM does.
        scores = [scoring.embedding_score(one, two, sim.config.embedding_dim) for one, two in pairs]
    if params.endpoint == "rerank":
        body = rerank_response(
            model=model,
            documents=params.texts_2,
            scores=scores,
            top_n=params.top_n,
            tokens=tokens,
        )
    else:
        body = score_response(model=model, scores=scores, tokens=tokens)
    return json_response(body)
