"""The chat completion request as this API reads it: OpenAI's JSON body, validated strictly, and
the X-Session-Id header. A refusal is a 400 that names the field and what it accepts."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from chat.openai_api.replies import Reply, error_reply
from core.text import text_problem


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[_Part]

    @property
    def text(self) -> str | None:
        """A string, or the text parts of a list joined; None when there is no text at all."""
        if isinstance(self.content, str):
            return self.content
        texts = [part.text for part in self.content if part.type == "text"]
        return "\n".join(texts) if texts and all(isinstance(t, str) for t in texts) else None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


_Tokens = Annotated[StrictInt, Field(ge=1, le=32768)]


class _Body(BaseModel):
    """What this API reads of a chat completion request; the rest of OpenAI's fields are allowed
    and ignored. Strict types: `"5"` is no number and `true` no token count."""

    model_config = ConfigDict(extra="allow")
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[_Message], Field(min_length=1)]
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    # vLLM's extension (llama.cpp's server takes it too): generate to max_tokens whatever the model
    # says. Passed on to local engines only; benchmarks use it for answers of a known length.
    ignore_eos: StrictBool = False
    n: Literal[1] | None = None
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None


# The 400's message for a field the schema refused, by field: one wording per field, whatever the
# reason (type, range, missing), naming what is accepted.
_REFUSED = {
    "model": '`model` is required: "auto" or a name from /v1/models.',
    "messages": "`messages` must be a non-empty list.",
    "max_tokens": "`max_tokens` must be a number from 1 to 32768.",
    "max_completion_tokens": "`max_completion_tokens` must be a number from 1 to 32768.",
    "temperature": "`temperature` must be a number from 0 to 2.",
    "ignore_eos": "`ignore_eos` must be a boolean.",
    "n": "Only n=1 is supported.",
    "stream": "`stream` must be a boolean.",
    "stream_options": "`stream_options` must be an object.",
}


def completion_request(raw_body: bytes) -> dict | Reply:
    """The request's question, history, system text and options, or the 400 refusing it."""
    try:
        body = json.loads(raw_body or b"")
    except ValueError as exc:
        return error_reply(400, f"The body is not valid JSON: {exc}.")
    try:
        request = _Body.model_validate(body)
    except ValidationError as exc:
        return _schema_refused(exc)
    history, system = [], []
    for index, message in enumerate(request.messages):
        text = message.text
        if text is None:
            return _message_refused(index)
        # Every message, not only the question: all of them go to the engine, and none may cost a
        # rate-limit slot by failing later.
        if (problem := text_problem(text)) is not None:
            return error_reply(
                400,
                f"messages[{index}] {problem}.",
                code="invalid_text",
                param=f"messages[{index}]",
            )
        if message.role in ("system", "developer"):
            system.append(text)
        else:
            history.append({"role": message.role, "content": text})
    if not history or history[-1]["role"] != "user":
        return error_reply(400, "The last message must come from the user.", param="messages")
    options = {
        "max_tokens": request.max_completion_tokens or request.max_tokens,
        "temperature": request.temperature,
    }
    return {
        "model": request.model,
        "question": history[-1]["content"],
        "history": history[:-1],
        "system": "\n\n".join(system),
        "stream": request.stream,
        "include_usage": bool(request.stream_options and request.stream_options.include_usage),
        "ignore_eos": request.ignore_eos,
        **{name: value for name, value in options.items() if value is not None},
    }


def _message_refused(index: int) -> Reply:
    return error_reply(
        400,
        f"messages[{index}] needs a role (system, user, assistant) and text content.",
        param=f"messages[{index}]",
    )


def _schema_refused(exc: ValidationError) -> Reply:
    loc = exc.errors(include_url=False)[0]["loc"]
    if not loc:
        return error_reply(400, "The request body must be a JSON object.")
    if loc[0] == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        return _message_refused(loc[1])
    return error_reply(400, _REFUSED[loc[0]], param=str(loc[0]))


def session_named(headers: dict[str, str]) -> int | None | Reply:
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
