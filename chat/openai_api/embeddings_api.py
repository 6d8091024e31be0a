"""`POST /v1/embeddings`: vectors of texts (or token ids) by an endpoint that serves embeddings,
or by the knowledge base's own embedding model.

The request's fields are known (inference_ops.openai_fields, its EMBEDDING_ tables): `model`,
`input` and `encoding_format` are read, the others passed on as sent to the kinds of engine that
take them, or refused with a 400 that names them. Each input is bounded (ROUTING_MAX_INPUT_CHARS
characters or token ids: a 413) and so is their number (V1_EMBEDDING_MAX_INPUTS: a 400). The call
is routed by routing.embeddings.embed.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass

import numpy as np
from django.conf import settings

from chat.exceptions import RateLimited
from chat.openai_api.calls import run_call
from chat.openai_api.handlers import authenticate
from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    error_reply,
    pipeline_error_reply,
    route_headers,
)
from chat.openai_api.schema import request_fields
from core.text import text_problem
from inference_ops import openai_fields
from observability.models import RequestLog
from routing import events
from routing.embeddings import EmbeddingAsk, Vectors, embed
from routing.prompt import approx_tokens

_INPUT_SHAPE = (
    "`input` must be a non-empty string, a list of non-empty strings, token ids (a list of "
    "integers), or a list of such lists."
)


@dataclass
class EmbeddingsRequest:
    model: str
    ask: EmbeddingAsk
    passthrough: events.Passthrough


def embeddings_request(raw_body: bytes) -> EmbeddingsRequest | Reply:
    """The request as routing.embeddings takes it, or the 4xx refusing it."""
    body = request_fields(
        raw_body,
        known=openai_fields.EMBEDDING_KNOWN,
        refused=openai_fields.EMBEDDING_REFUSED,
        what="embeddings",
    )
    if isinstance(body, Reply):
        return body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error_reply(
            400, '`model` is required: "auto" or a name from /v1/models.', param="model"
        )
    encoding_format = body.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"  # OpenAI's default
    if encoding_format not in ("float", "base64"):
        return error_reply(
            400,
            "`encoding_format` must be float or base64.",
            code="unsupported_parameter",
            param="encoding_format",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        return error_reply(400, "`dimensions` must be a number of at least 1.", param="dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        return error_reply(400, "`user` must be a string.", param="user")
    if "input" not in body:
        return error_reply(400, _INPUT_SHAPE, param="input")
    ask = _ask(body["input"], encoding_format=encoding_format, dimensions=dimensions)
    if isinstance(ask, Reply):
        return ask
    fields = {
        name: value
        for name, value in body.items()
        if name not in openai_fields.EMBEDDING_GATEWAY and value is not None
    }
    return EmbeddingsRequest(
        model=model,
        ask=ask,
        passthrough=events.Passthrough(
            fields=fields, limited=openai_fields.kinds_for(fields, openai_fields.EMBEDDINGS)
        ),
    )


def _ask(value, *, encoding_format: str, dimensions: int | None) -> EmbeddingAsk | Reply:
    """The inputs, each checked: text that can be sent, within the size limit."""
    limit = settings.ROUTING_MAX_INPUT_CHARS
    if isinstance(value, str):
        inputs: list = [value]
    elif isinstance(value, list) and value and _ids(value):
        inputs = [value]  # one input of token ids
    elif isinstance(value, list) and value:
        inputs = value
    else:
        return error_reply(400, _INPUT_SHAPE, param="input")
    if len(inputs) > settings.V1_EMBEDDING_MAX_INPUTS:
        return error_reply(
            400,
            f"`input` has {len(inputs)} inputs; at most {settings.V1_EMBEDDING_MAX_INPUTS} go in "
            "one request.",
            code="too_many_inputs",
            param="input",
        )
    texts = [item for item in inputs if isinstance(item, str)]
    if texts and len(texts) != len(inputs):
        return error_reply(400, _INPUT_SHAPE, param="input")
    tokens = 0
    for index, item in enumerate(inputs):
        where = "input" if isinstance(value, str) or inputs[0] is value else f"input[{index}]"
        if isinstance(item, str):
            if not item:
                return error_reply(400, f"`{where}` is empty.", param=where)
            if (problem := text_problem(item)) is not None:
                return error_reply(400, f"`{where}` {problem}.", code="invalid_text", param=where)
            size, tokens = len(item), tokens + approx_tokens(item)
            unit = "characters"
        elif isinstance(item, list) and item and _ids(item):
            size, tokens = len(item), tokens + len(item)
            unit = "token ids"
        else:
            return error_reply(400, _INPUT_SHAPE, param="input")
        if size > limit:
            return error_reply(
                413,
                f"`{where}` has {size} {unit}; the limit is {limit} per input.",
                code="input_too_large",
                param=where,
            )
    return EmbeddingAsk(
        input=value,
        texts=texts or None,
        tokens=tokens,
        encoding_format=encoding_format,
        dimensions=dimensions,
    )


def _ids(items: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in items)


def _encoded(vector, encoding_format: str):
    """A vector as the client asked for it: floats, or base64 of little-endian float32s (what
    OpenAI's SDKs decode)."""
    if encoding_format == "base64":
        if isinstance(vector, str):
            return vector
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    if isinstance(vector, str):
        return np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    return vector


async def embeddings(headers: dict[str, str], raw_body: bytes, arrived: float) -> Reply:
    key = await authenticate(headers)
    if isinstance(key, Reply):
        return key
    parsed = embeddings_request(raw_body)
    if isinstance(parsed, Reply):
        return parsed
    request_key = uuid.uuid4()
    spent = events.Spent()
    asked = events.RouteRequest(
        text="",
        user_id=key.user_id,
        groups=key.group_names,
        client=key.client,
        model=parsed.model,
        store=False,
        key=request_key,
        api_key_id=key.pk,
        spent=spent,
        passthrough=parsed.passthrough,
        api=RequestLog.Api.EMBEDDINGS,
    )
    call = run_call(
        key=key,
        api=RequestLog.Api.EMBEDDINGS,
        answer=embed(asked, parsed.ask),
        arrived=arrived,
        request_key=request_key,
        spent=spent,
    )
    route, vectors, done = None, None, None
    try:
        async for event in call:
            if isinstance(event, events.Error):
                return await pipeline_error_reply(event, key.user)
            if isinstance(event, events.Route):
                route = event
            elif isinstance(event, Vectors):
                vectors = event.vectors
            elif isinstance(event, events.Done):
                done = event
    except RateLimited as exc:  # too many questions, or too many answers at once
        code = "rate_limit_exceeded" if exc.code == RateLimited.code else exc.code
        return error_reply(429, str(exc), code=code, headers={"Retry-After": str(exc.retry_after)})
    finally:
        await call.aclose()
    assert route is not None and vectors is not None and done is not None
    encoding = parsed.ask.encoding_format
    body = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)}
            for index, vector in enumerate(vectors)
        ],
        "model": route.target,
        "usage": done.usage,
    }
    headers = {OVERHEAD_HEADER: f"{done.overhead_ms:.1f}", **route_headers(route)}
    return Reply(200, body, headers)
