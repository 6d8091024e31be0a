"""vLLM's OpenAI-compatible wire format: request validation, errors, responses.

Shapes follow vLLM's `entrypoints/openai` protocol models: errors are
`{"error": {"message", "type", "param", "code"}}` with the HTTP status as
`code`, streamed chunks carry `finish_reason`/`stop_reason` like vLLM's.
"""

import functools
import json
import time
import uuid
from dataclasses import dataclass, field

from .tokenizer import chat_prompt_tokens, message_text, tokenize

# What the OpenAI SDK and vLLM clients see as the server's engine message when
# generation fails (vLLM's EngineDeadError text).
ENGINE_ERROR_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)

# Compact like pydantic's model_dump_json, which is what vLLM sends.
dumps = functools.partial(json.dumps, separators=(",", ":"))


class APIError(Exception):
    def __init__(
        self,
        message: str,
        *,
        err_type: str = "BadRequestError",
        status: int = 400,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.err_type = err_type
        self.status = status
        self.param = param

    def body(self) -> dict:
        return error_body(
            self.message, err_type=self.err_type, status=self.status, param=self.param
        )


def error_body(message: str, *, err_type: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def validation_error(loc: str, msg: str, kind: str) -> APIError:
    # vLLM turns FastAPI's RequestValidationError into a 400 whose message is
    # pydantic's error list; clients only show it, so a look-alike is enough.
    return APIError(str([{"type": kind, "loc": ("body", loc), "msg": msg}]))


@dataclass
class GenerationParams:
    endpoint: str  # "chat" or "completion"
    model: str | None
    prompt_tokens: list[str]
    echo_text: str | None  # what echo mode repeats: the last user message, or the prompt
    max_tokens: int | None
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    seed: int | None = None


def parse_chat(body) -> GenerationParams:
    body = _require_object(body)
    messages = body.get("messages")
    if messages is None:
        raise validation_error("messages", "Field required", "missing")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise validation_error(
            "messages", "Input should be a list of messages with a role", "list_type"
        )
    user_texts = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    # vLLM: max_completion_tokens supersedes the deprecated max_tokens.
    max_tokens = _optional_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens")
    return _common(
        body,
        GenerationParams(
            endpoint="chat",
            model=_optional_str(body, "model"),
            prompt_tokens=chat_prompt_tokens(messages),
            echo_text=user_texts[-1] if user_texts else "",
            max_tokens=max_tokens,
        ),
    )


def parse_completion(body) -> GenerationParams:
    body = _require_object(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise validation_error("prompt", "Field required", "missing")
    # One prompt only (the simulator has no batched completions): a string,
    # a one-string list, token ids, or a one-element list of token ids.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens, echo_text = tokenize(prompt), prompt
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        tokens, echo_text = [str(t) for t in prompt], None  # ids cannot be echoed back as text
    else:
        raise APIError(
            "The simulator accepts a single prompt: a string or a list of token ids.",
            param="prompt",
        )
    return _common(
        body,
        GenerationParams(
            endpoint="completion",
            model=_optional_str(body, "model"),
            prompt_tokens=tokens,
            echo_text=echo_text,
            max_tokens=_optional_int(body, "max_tokens"),
        ),
    )


def _common(body: dict, params: GenerationParams) -> GenerationParams:
    if params.max_tokens is not None and params.max_tokens < 1:
        raise APIError(
            f"max_tokens must be at least 1, got {params.max_tokens}.", param="max_tokens"
        )
    n = _optional_int(body, "n")
    if n is not None and n != 1:
        raise APIError("The simulator only supports n=1.", param="n")
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
            raise validation_error("temperature", "Input should be a valid number", "float_type")
        if temperature < 0:
            raise APIError(
                f"temperature must be non-negative, got {temperature}.", param="temperature"
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise validation_error("stream", "Input should be a valid boolean", "bool_type")
    params.stream = bool(stream)
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not params.stream:
            raise APIError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if not isinstance(stream_options, dict):
            raise validation_error("stream_options", "Input should be an object", "dict_type")
        params.include_usage = bool(
            stream_options.get("include_usage", True)
        )  # vLLM defaults it to true
    stop = body.get("stop")
    if isinstance(stop, str):
        params.stop = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        params.stop = stop
    elif stop is not None:
        raise validation_error("stop", "Input should be a string or a list of strings", "list_type")
    params.include_stop_str_in_output = bool(body.get("include_stop_str_in_output", False))
    params.seed = _optional_int(body, "seed")
    return params


def context_length_error(
    *, max_model_len: int, prompt_tokens: int, max_tokens: int | None
) -> APIError | None:
    """vLLM's 400 when the prompt and the requested output do not fit the context window."""
    requested = max_tokens or 0
    too_long = (
        prompt_tokens + requested > max_model_len
        if max_tokens is not None
        else prompt_tokens >= max_model_len
    )
    if not too_long:
        return None
    return APIError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{requested} output tokens and your prompt contains at least {prompt_tokens} input "
        f"tokens, for a total of at least {prompt_tokens + requested} tokens. Please reduce the "
        "length of the input prompt or the number of requested output tokens. "
        f"(parameter=input_tokens, value={prompt_tokens})",
        param="input_tokens",
    )


def _require_object(body) -> dict:
    if not isinstance(body, dict):
        raise validation_error("body", "Input should be a valid dictionary", "dict_type")
    return body


def _optional_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error(key, "Input should be a valid integer", "int_type")
    return value


def _optional_str(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise validation_error(key, "Input should be a valid string", "string_type")
    return value


# -- responses -------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


class ChunkWriter:
    """The SSE chunks of one streamed request.

    The constant part of every chunk is rendered once; per chunk only the
    token text is JSON-encoded, which keeps hundreds of streams cheap.
    """

    def __init__(self, *, endpoint: str, model: str):
        self.endpoint = endpoint
        self.request_id = (
            f"chatcmpl-{uuid.uuid4().hex}" if endpoint == "chat" else f"cmpl-{uuid.uuid4().hex}"
        )
        obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
        head = dumps(
            {"id": self.request_id, "object": obj, "created": int(time.time()), "model": model}
        )
        self._head = "data: " + head[:-1] + ',"choices":['

    def role(self) -> bytes:
        # vLLM opens a chat stream with the assistant role and empty content.
        return self._chunk(
            '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
        )

    def delta(
        self, text: str, finish_reason: str | None = None, stop_reason: str | None = None
    ) -> bytes:
        end = "null"
        if finish_reason is not None:
            end = f'{dumps(finish_reason)},"stop_reason":{dumps(stop_reason)}'
        if self.endpoint == "chat":
            choice = (
                f'{{"index":0,"delta":{{"content":{_json_text(text)}}},'
                f'"logprobs":null,"finish_reason":{end}}}'
            )
        else:
            choice = (
                f'{{"index":0,"text":{_json_text(text)},"logprobs":null,"finish_reason":{end}}}'
            )
        return self._chunk(choice)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (
            self._head + '],"usage":' + dumps(usage(prompt_tokens, completion_tokens)) + "}\n\n"
        ).encode()

    @staticmethod
    def error(message: str = ENGINE_ERROR_MESSAGE) -> bytes:
        body = error_body(message, err_type="InternalServerError", status=500)
        return f"data: {dumps(body)}\n\n".encode()

    DONE = b"data: [DONE]\n\n"

    def _chunk(self, choice: str) -> bytes:
        return (self._head + choice + "]}\n\n").encode()


@functools.lru_cache(maxsize=8192)
def _json_text(text: str) -> str:
    # Generated tokens come from a small vocabulary: encode each string once,
    # not once per chunk per stream.
    return dumps(text)


def full_response(
    *,
    endpoint: str,
    model: str,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict:
    created = int(time.time())
    if endpoint == "chat":
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "tool_calls": [],
                        "reasoning_content": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": stop_reason,
                }
            ],
            "usage": usage(prompt_tokens, completion_tokens),
            "prompt_logprobs": None,
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_logprobs": None,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


# -- /rerank and /score ------------------------------------------------------------


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
    results = [
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
