"""vLLM's /rerank and /score requests (a cross-encoder's, or an embedding model's): parsing and
validation with vLLM 0.32's errors, the pairs to score, and the responses. The scoring itself is
`scoring`."""

import time
import uuid
from dataclasses import dataclass

from .errors import APIError, validation_error
from .protocol import _optional_int, _optional_str, _require_object, usage


@dataclass
class ScoreParams:
    """A rerank or score request: each text of `texts_1` (one, or one per text of `texts_2`)
    against the text of `texts_2` at the same place."""

    endpoint: str  # "rerank" or "score"
    model: str | None
    texts_1: list[str]
    texts_2: list[str]
    top_n: int = 0  # rerank: how many results to return; 0 (vLLM's default) for all


def parse_rerank(body) -> ScoreParams:
    # vLLM's RerankRequest, the Jina/Cohere shape: one query, a list of documents.
    body = _require_object(body)
    query = body.get("query")
    if query is None:
        raise validation_error("query", "Field required", "missing")
    if not isinstance(query, str):
        raise validation_error("query", "Input should be a valid string", "string_type")
    documents = body.get("documents")
    if documents is None:
        raise validation_error("documents", "Field required", "missing")
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise validation_error("documents", "Input should be a valid list of strings", "list_type")
    top_n = _optional_int(body, "top_n")
    _optional_int(body, "truncate_prompt_tokens")
    return ScoreParams(
        endpoint="rerank",
        model=_optional_str(body, "model"),
        texts_1=[query],
        texts_2=documents,
        top_n=top_n or 0,
    )


def parse_score(body) -> ScoreParams:
    # vLLM's ScoreRequest, like sentence-transformers' CrossEncoder: text_1 and text_2, each a
    # string or a list of strings.
    body = _require_object(body)
    texts = []
    for key in ("text_1", "text_2"):
        value = body.get(key)
        if value is None:
            raise validation_error(key, "Field required", "missing")
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise validation_error(
                key, "Input should be a valid string or list of strings", "string_type"
            )
        texts.append(value)
    _optional_int(body, "truncate_prompt_tokens")
    return ScoreParams(
        endpoint="score", model=_optional_str(body, "model"), texts_1=texts[0], texts_2=texts[1]
    )


def score_pairs(params: ScoreParams) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs to score, or vLLM's 400 for lengths that do not pair up."""
    one, two = params.texts_1, params.texts_2
    if len(one) > 1 and len(one) != len(two):
        raise APIError("Input lengths must be either 1:1, 1:N or N:N")
    if not one:
        raise APIError("At least one text element must be given")
    if not two:
        raise APIError("At least one text_pair element must be given")
    return list(zip(one * len(two) if len(one) == 1 else one, two))


def pair_length_error(*, max_model_len: int, tokens: int, endpoint: str) -> APIError | None:
    if tokens <= max_model_len:
        return None
    # vLLM names the operation by the request type; a rerank request is not in its table.
    operation = "score" if endpoint == "score" else "embedding generation"
    return APIError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{tokens} tokens in the input for {operation}. Please reduce the length of the input."
    )


def rerank_response(
    *, model: str, documents: list[str], scores: list[float], top_n: int, tokens: int
) -> dict:
    results: list[dict] = [
        {"index": index, "document": {"text": documents[index]}, "relevance_score": score}
        for index, score in enumerate(scores)
    ]
    # Sorted by relevance (a stable sort: ties keep their order), then cut to top_n when it is set.
    results.sort(key=lambda result: result["relevance_score"], reverse=True)
    if 0 < top_n < len(results):
        results = results[:top_n]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"total_tokens": tokens},
        "results": results,
    }


def score_response(*, model: str, scores: list[float], tokens: int) -> dict:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": index, "object": "score", "score": score}
            for index, score in enumerate(scores)
        ],
        "usage": usage(tokens, 0),
    }
