"""vLLM's OpenAI-compatible requests: parsing and validation, with vLLM 0.32's errors.

Validation runs in vLLM's order where one request breaks several rules: the request model's
checks (tools, structured outputs, logprobs, stream options), the fields, then the sampling
parameters (n, temperature, max_tokens). What needs the server (the model, the tool parser, the
context window) is checked by the route, and what vLLM's engine checks when it takes the request
in (the logprobs limit, a regex that does not compile) later still.
"""

from dataclasses import dataclass, field

from . import messages, structured, tools
from .errors import (  # noqa: F401 - the other routes import the error helpers from here
    ENGINE_ERROR_MESSAGE,
    APIError,
    dumps,
    error_body,
    validation_error,
    vllm_error,
)
from .structured import Constraint
from .tokenizer import tokenize
from .tools import ToolRequest

MAX_N_SEQUENCES = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default


@dataclass
class GenerationParams:
    endpoint: str  # "chat" or "completion"
    model: str | None
    prompt_tokens: list[str]
    echo_text: (
        str | None
    )  # what echo mode repeats: the last user message (or tool result), or the prompt
    max_tokens: int | None
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None  # top logprobs per step (-1: the vocabulary); None: not asked
    echo: bool = False  # completions: the answer starts with the prompt's text
    suffix: str | None = None  # completions: the text after the insertion (FIM)
    request_id: str | None = None  # the client's own, from the body
    tools: ToolRequest | None = None
    constraint: Constraint | None = None
    media_tokens: dict[str, int] = field(default_factory=dict)
    ends_with_tool_result: bool = False
    # continue_final_message: the tokens of the assistant's partial answer, which the answer
    # continues (0: a new answer).
    prefill_tokens: int = 0
    continue_final: bool = False
    # vLLM takes it under either policy; only --scheduling-policy priority orders by it.
    priority: int = 0

    @property
    def plain(self) -> bool:
        """One choice and no logprobs: the stream can take the cheap path, unless a tool call
        is planned."""
        return self.n == 1 and self.logprobs is None


def parse_chat(body) -> GenerationParams:
    body = _require_object(body)
    tool_request = tools.parse(body)
    constraint = structured.parse(
        body, endpoint="chat", tool_choice=body.get("tool_choice", "none")
    )
    logprobs = _chat_logprobs(body)
    _check_stream_options(body)
    # ChatCompletionRequest.check_generation_prompt, a validator on the raw values.
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise vllm_error(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    continue_final = _optional_bool(body, "continue_final_message")
    add_generation_prompt = _optional_bool(body, "add_generation_prompt")
    prompt = messages.parse_messages(
        body.get("messages"),
        tool_request.tools if tool_request else None,
        # vLLM's default is true; with continue_final_message, unset counts as false.
        add_generation_prompt=add_generation_prompt is not False and not continue_final,
        continue_final=bool(continue_final),
    )
    # vLLM: max_completion_tokens supersedes the deprecated max_tokens.
    max_tokens = _optional_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens")
    return _common(
        body,
        GenerationParams(
            endpoint="chat",
            model=_optional_str(body, "model"),
            prompt_tokens=prompt.tokens,
            echo_text=prompt.echo_text,
            max_tokens=max_tokens,
            logprobs=logprobs,
            tools=tool_request,
            constraint=constraint,
            media_tokens=prompt.media_tokens,
            ends_with_tool_result=prompt.ends_with_tool_result,
            prefill_tokens=len(tokenize(prompt.prefill)) if prompt.prefill else 0,
            continue_final=bool(continue_final),
        ),
    )


def parse_completion(body) -> GenerationParams:
    body = _require_object(body)
    constraint = structured.parse(body, endpoint="completion")
    logprobs = _completion_logprobs(body)
    _check_stream_options(body)
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        # CompletionRequest.validate_prompt_and_prompt_embeds (no prompt embeddings here).
        raise vllm_error(
            "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
        )
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
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise validation_error("echo", "Input should be a valid boolean", "bool_type", echo)
    return _common(
        body,
        GenerationParams(
            endpoint="completion",
            model=_optional_str(body, "model"),
            prompt_tokens=tokens,
            echo_text=echo_text,
            max_tokens=_optional_int(body, "max_tokens"),
            logprobs=logprobs,
            constraint=constraint,
            echo=bool(echo),
            suffix=_optional_str(body, "suffix"),
        ),
    )


def suffix_error(params: GenerationParams) -> APIError | None:
    """vLLM's renderer on `suffix` (renderers/online_renderer.py): a model with no FIM template,
    as every simulated one is, refuses it."""
    if params.suffix is None:
        return None
    if params.echo:
        return APIError("Echo is unsupported with suffix.", param="suffix")
    if params.echo_text is None:
        return APIError(
            "suffix requires text prompt input for FIM completion rendering", param="suffix"
        )
    return APIError(
        "suffix is only supported for models with FIM completion rendering", param="suffix"
    )


def _chat_logprobs(body: dict) -> int | None:
    # ChatCompletionRequest.check_logprobs; the engine is asked for top_logprobs when logprobs.
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, (int, float)) or isinstance(top, bool)):
        raise vllm_error("`top_logprobs` must be an integer.", parameter="top_logprobs", value=top)
    if top is not None:
        if top < 0 and top != -1:
            raise vllm_error(
                "`top_logprobs` must be a positive value or -1.",
                parameter="top_logprobs",
                value=top,
            )
        if (top == -1 or top > 0) and not body.get("logprobs"):
            raise vllm_error(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                parameter="top_logprobs",
            )
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise validation_error("logprobs", "Input should be a valid boolean", "bool_type", wanted)
    if top is not None and top != int(top):
        raise validation_error(
            "top_logprobs", "Input should be a valid integer", "int_from_float", top
        )
    return int(top or 0) if wanted else None


def _completion_logprobs(body: dict) -> int | None:
    value = body.get("logprobs")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise vllm_error("`logprobs` must be an integer.", parameter="logprobs", value=value)
    if value < 0 and value != -1:
        raise vllm_error(
            "`logprobs` must be a positive value or -1.", parameter="logprobs", value=value
        )
    if value != int(value):
        raise validation_error(
            "logprobs", "Input should be a valid integer", "int_from_float", value
        )
    return int(value)


def _check_stream_options(body: dict) -> None:
    # An empty stream_options object is falsy to vLLM's check, so it passes without stream.
    if body.get("stream_options") and not body.get("stream"):
        raise vllm_error(
            "Stream options can only be defined when `stream=True`.", parameter="stream_options"
        )


def _common(body: dict, params: GenerationParams) -> GenerationParams:
    temperature = body.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, (int, float)) or isinstance(temperature, bool)
    ):
        raise validation_error(
            "temperature", "Input should be a valid number", "float_type", temperature
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise validation_error("stream", "Input should be a valid boolean", "bool_type", stream)
    params.stream = bool(stream)
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise validation_error(
                "stream_options", "Input should be a valid dictionary", "dict_type", stream_options
            )
        # StreamOptions.include_usage defaults to false; continuous_usage_stats is not modelled.
        params.include_usage = bool(stream_options.get("include_usage", False))
    stop = body.get("stop")
    if isinstance(stop, str):
        params.stop = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        params.stop = stop
    elif stop is not None:
        raise validation_error("stop", "Input should be a valid list", "list_type", stop)
    params.include_stop_str_in_output = bool(body.get("include_stop_str_in_output", False))
    params.seed = _optional_int(body, "seed")
    params.priority = _optional_int(body, "priority") or 0
    n = _optional_int(body, "n")
    params.n = 1 if n is None else n
    request_id = body.get("request_id")
    params.request_id = request_id if isinstance(request_id, str) and request_id else None

    # SamplingParams._verify_args, in its order.
    if params.n < 1:
        raise vllm_error(f"n must be at least 1, got {params.n}.")
    if params.n > MAX_N_SEQUENCES:
        raise vllm_error(
            f"n must be at most {MAX_N_SEQUENCES}, got {params.n}. To increase this limit, set "
            "the VLLM_MAX_N_SEQUENCES environment variable."
        )
    if temperature is not None and temperature < 0:
        raise vllm_error(
            f"temperature must be non-negative, got {float(temperature)}.",
            parameter="temperature",
            value=float(temperature),
        )
    if temperature is not None and temperature > 2:
        raise vllm_error(
            f"temperature must be in [0, 2], got {float(temperature)}.",
            parameter="temperature",
            value=float(temperature),
        )
    if params.max_tokens is not None and params.max_tokens < 1:
        raise vllm_error(
            f"max_tokens must be at least 1, got {params.max_tokens}.",
            parameter="max_tokens",
            value=params.max_tokens,
        )
    if any(not s for s in params.stop):
        raise vllm_error("stop cannot contain an empty string.")
    # Temperature 0 is greedy sampling, whose n choices would all be the same answer. An unset
    # temperature is 1.0 (the simulator has no generation_config to take a default from).
    if params.n > 1 and temperature is not None and temperature < 1e-5:
        raise vllm_error(f"n must be 1 when using greedy sampling, got {params.n}.")
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
        raise validation_error("body", "Input should be a valid dictionary", "dict_type", body)
    return body


def _optional_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error(key, "Input should be a valid integer", "int_type", value)
    return value


def _optional_bool(body: dict, key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise validation_error(key, "Input should be a valid boolean", "bool_type", value)
    return value


def _optional_str(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise validation_error(key, "Input should be a valid string", "string_type", value)
    return value


# -- pooling responses ---------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """UsageInfo as model_dump() gives it."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
