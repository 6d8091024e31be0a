"""The chat completion request as this API reads it: OpenAI's JSON body, validated strictly, and
the X-Session-Id header. A refusal is a 400 that names the field and what it accepts. Its
messages are read by chat.openai_api.messages.

Every field of OpenAI's request (and vLLM's own) is known here (inference_ops.openai_fields): the
ones the gateway's policy owns are read, every other one is checked for its type and passed on to
the engine as the client sent it. A field this API does not know is refused, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from chat.openai_api.messages import message_problem, message_text, split_conversation
from chat.openai_api.replies import Reply, error_reply
from inference_ops import openai_fields
from inference_ops.openai_fields import EXTERNAL, VLLM
from routing.events import Passthrough

MAX_CHOICES = 16  # `n`: each choice is a whole answer, reserved against the caller's limits
MAX_STOPS = 16

_Tokens = Annotated[StrictInt, Field(ge=1, le=32768)]
_Number = StrictFloat | StrictInt


def _ranged(low: float, high: float):
    return Annotated[_Number, Field(ge=low, le=high)]


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    # OpenAI pads its chunks against a side channel; the gateway's stream carries no padding.
    include_obfuscation: Literal[False] = False
    continuous_usage_stats: StrictBool = False  # vLLM's: refused below, usage is the gateway's


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function", "custom"]
    function: _Function | None = None


class _NamedChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function", "custom", "allowed_tools"]


class _JsonSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class _ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: _JsonSchema | None = None


class _Body(BaseModel):
    """The request's fields and their types. Unknown fields are refused: a field this API does not
    know would otherwise be dropped without a word. Strict types: `"5"` is no number and `true` no
    token count."""

    # Unknown fields are refused before this model reads the body (completion_request).
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    # The gateway's own.
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[Any], Field(min_length=1)]
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    stream: StrictBool | None = None
    stream_options: _StreamOptions | None = None
    # OpenAI's, for every engine.
    temperature: _ranged(0, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    top_p: _ranged(0, 1) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    n: Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOPS)] | None = None
    seed: StrictInt | None = None
    presence_penalty: _ranged(-2, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    frequency_penalty: _ranged(-2, 2) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    logit_bias: dict[str, _ranged(-100, 100)] | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    response_format: _ResponseFormat | None = None
    tools: Annotated[list[_Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    user: StrictStr | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    metadata: dict[str, StrictStr] | None = None
    # OpenAI's, for external targets.
    audio: dict[str, Any] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    service_tier: StrictStr | None = None
    store: StrictBool | None = None
    moderation: dict[str, Any] | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: StrictStr | dict[str, Any] | None = None
    # vLLM's, for vLLM targets (the three sampling ones for llama.cpp's server too). Its other
    # fields are not declared here: vLLM checks their values, and its 400 comes back as one.
    top_k: StrictInt | None = None
    min_p: _ranged(0, 1) | None = None  # type: ignore[valid-type]  # pydantic reads _ranged's Annotated
    ignore_eos: StrictBool | None = None
    repetition_penalty: Annotated[_Number, Field(gt=0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    echo: StrictBool | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=1024)] | None = None


# The 400's message for a field the schema refused, by field: one wording per field, whatever the
# reason (type, range, missing), naming what is accepted. Fields not listed get a generic one.
_REFUSED = {
    "model": '`model` is required: "auto" or a name from /v1/models.',
    "messages": "`messages` must be a non-empty list.",
    "max_tokens": "`max_tokens` must be a number from 1 to 32768.",
    "max_completion_tokens": "`max_completion_tokens` must be a number from 1 to 32768.",
    "temperature": "`temperature` must be a number from 0 to 2.",
    "top_p": "`top_p` must be a number from 0 to 1.",
    "n": f"`n` must be a number from 1 to {MAX_CHOICES}.",
    "stop": f"`stop` must be a string or a list of at most {MAX_STOPS} strings.",
    "presence_penalty": "`presence_penalty` must be a number from -2 to 2.",
    "frequency_penalty": "`frequency_penalty` must be a number from -2 to 2.",
    "logit_bias": "`logit_bias` must map token ids to numbers from -100 to 100.",
    "top_logprobs": "`top_logprobs` must be a number from 0 to 20.",
    "response_format": "`response_format` must be {type: text | json_object | json_schema}, "
    "a json_schema one with json_schema.name (and its schema as an object).",
    "tools": "`tools` must be a list of at most 128 tools, each {type: function, function: "
    "{name (letters, digits, _ . : -, at most 64), description, parameters: a JSON schema}}.",
    "tool_choice": '`tool_choice` must be "none", "auto", "required" or '
    '{"type": "function", "function": {"name": …}}.',
    "ignore_eos": "`ignore_eos` must be a boolean.",
    "stream": "`stream` must be a boolean.",
    "stream_options": "`stream_options` must be an object: {include_usage: boolean} "
    "(the gateway's stream has no obfuscation to include).",
}


@dataclass
class CompletionRequest:
    """A chat completion request as the gateway reads it: the parts its policy owns, the question
    that rules and the KB read, and what is carried to the engine as the client sent it."""

    model: str
    stream: bool
    include_usage: bool
    text: str  # the last user message's text: what the rules, the KB and the context read
    system: str  # the client's leading system and developer messages, joined
    history: list[dict]  # the messages between those and the question, as sent
    max_tokens: int | None
    temperature: float | None
    passthrough: Passthrough


def request_fields(
    raw_body: bytes, *, known: frozenset[str], refused: dict[str, str], what: str
) -> dict | Reply:
    """The body as a JSON object, or the 400 for one that is not JSON, not an object, or names a
    field a client may not set (`refused`, with why) or this API does not know (`known`)."""
    try:
        body = json.loads(raw_body or b"")
    except ValueError as exc:
        return error_reply(400, f"The body is not valid JSON: {exc}.")
    if not isinstance(body, dict):
        return error_reply(400, "The request body must be a JSON object.")
    for name in body:
        if name in refused:
            return error_reply(
                400,
                f"`{name}` may not be set by a client: {refused[name]}.",
                code="unsupported_parameter",
                param=name,
            )
        if name not in known:
            return error_reply(
                400,
                f"Unrecognized request argument supplied: {name}. This gateway passes on every "
                f"field of OpenAI's {what} request and vLLM's own; see docs/api.md.",
                code="unknown_parameter",
                param=name,
            )
    return body


def completion_request(raw_body: bytes) -> CompletionRequest | Reply:
    """The request as the pipeline takes it, or the 400 refusing it."""
    body = request_fields(
        raw_body, known=openai_fields.KNOWN, refused=openai_fields.REFUSED, what="chat completion"
    )
    if isinstance(body, Reply):
        return body
    try:
        request = _Body.model_validate(body)
    except ValidationError as exc:
        return _schema_refused(exc)
    if request.stream_options is not None and request.stream_options.continuous_usage_stats:
        return error_reply(
            400,
            "`stream_options.continuous_usage_stats` is not served: the usage comes once, "
            "at the end (include_usage).",
            code="unsupported_parameter",
            param="stream_options",
        )
    if request.stream_options is not None and not request.stream:
        return error_reply(
            400,
            "`stream_options` is only allowed with `stream: true`.",
            param="stream_options",
        )
    if request.top_logprobs and not request.logprobs:
        return error_reply(400, "`top_logprobs` needs `logprobs: true`.", param="top_logprobs")
    messages = body["messages"]
    limited: dict[str, frozenset[str]] = {}
    for index, message in enumerate(messages):
        problem = message_problem(message, index, limited)
        if problem is not None:
            return problem
    conversation = split_conversation(messages)
    if isinstance(conversation, Reply):
        return conversation
    system, history, question, after = conversation
    fields = {
        name: value
        for name, value in body.items()
        if name not in openai_fields.GATEWAY and value is not None
    }
    limited.update(openai_fields.kinds_for(fields))
    limited.update(_limited_by_value(request))
    max_tokens_field = (
        "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    )
    return CompletionRequest(
        model=request.model,
        stream=bool(request.stream),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        text=(message_text(question) or "") if question is not None else "",
        system=system,
        history=history,
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=request.temperature,
        passthrough=Passthrough(
            question=question,
            after=tuple(after),
            fields={name: value for name, value in fields.items() if name != "temperature"},
            max_tokens_field=max_tokens_field,
            limited=limited,
            not_plain=_not_plain(request, question, after),
            features=_features(request, messages),
            choices=request.n or 1,
        ),
    )


def _limited_by_value(request: _Body) -> dict[str, frozenset[str]]:
    """Fields whose value decides which engines take them."""
    limited = {}
    if request.response_format is not None and request.response_format.type == "structural_tag":
        limited["response_format"] = frozenset({VLLM})
    if request.tools and any(tool.type != "function" for tool in request.tools):
        limited["tools"] = frozenset({EXTERNAL})
    if isinstance(request.tool_choice, _NamedChoice) and request.tool_choice.type != "function":
        limited["tool_choice"] = frozenset({EXTERNAL})
    return limited


def _not_plain(request: _Body, question: dict | None, after: list[dict]) -> str | None:
    """Why a stored text answer would not satisfy this request, or None when it would."""
    if after:
        return "the conversation goes on after the question (a tool result for the model to read)"
    if question is None:
        return "there is no user question"
    if isinstance(question.get("content"), list) and any(
        part.get("type") != "text" for part in question["content"]
    ):
        return "the question carries more than text (an image, audio or a file)"
    if request.tools and request.tool_choice not in (None, "none", "auto"):
        return "tool_choice requires a tool call"
    if request.response_format is not None and request.response_format.type != "text":
        return f"response_format asks for {request.response_format.type}"
    if request.structured_outputs:
        return "structured outputs are asked for"
    if request.n is not None and request.n > 1:
        return f"n={request.n} choices are asked for"
    if request.logprobs:
        return "logprobs are asked for"
    if request.modalities and "audio" in request.modalities:
        return "audio output is asked for"
    if request.echo or request.continue_final_message:
        return "the answer continues the prompt"
    return None


def _features(request: _Body, messages: list[dict]) -> tuple[str, ...]:
    """Short names of what the request asks beyond text, for the request log."""
    found = []
    if request.tools or request.functions:
        found.append("tools")
    if any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
        found.append("tool_results")
    if (
        request.response_format is not None and request.response_format.type != "text"
    ) or request.structured_outputs:
        found.append("structured")
    if request.logprobs:
        found.append("logprobs")
    if request.n is not None and request.n > 1:
        found.append("n")
    if any(
        isinstance(m.get("content"), list)
        and any(part.get("type") not in ("text", "refusal") for part in m["content"])
        for m in messages
    ):
        found.append("media")
    return tuple(found)


def _schema_refused(exc: ValidationError) -> Reply:
    loc = exc.errors(include_url=False)[0]["loc"]
    if not loc:
        return error_reply(400, "The request body must be a JSON object.")
    name = str(loc[0])
    if name == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        return error_reply(
            400,
            f"messages[{loc[1]}] needs a role (system, developer, user, assistant or tool) and "
            "content.",
            param=f"messages[{loc[1]}]",
        )
    message = _REFUSED.get(name)
    if message is None:
        detail = exc.errors(include_url=False)[0]["msg"]
        message = f"`{name}` is not valid: {detail}."
    return error_reply(400, message, param=name)


def session_named(headers: dict[str, str]) -> int | Reply | None:
    """The chat session a call asks to be stored in (`X-Session-Id`), if any."""
    raw = headers.get("x-session-id", "").strip()
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return error_reply(
            400,
            "X-Session-Id must be the id of one of your chat sessions.",
            code="invalid_session",
            param="X-Session-Id",
        )
    return int(raw)
