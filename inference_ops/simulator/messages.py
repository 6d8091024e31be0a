"""Chat messages as vLLM takes them, and the simulated chat template that turns them (and the
tools) into prompt tokens.

vLLM validates messages against the union of OpenAI's message types and its own permissive one
(a `role` string and optional content, name, tool_call_id, tool_calls), so any role goes and a
tool message may omit tool_call_id; what fails is the shape: no role, content that is neither a
string nor a list of parts, a tool call without its function. Content parts are parsed when the
prompt is rendered (vLLM's renderers/chat_utils.py): text-like parts become text, media parts
become placeholder tokens, and any other type is a 400 naming the supported ones (OpenAI's
`file` part among them: vLLM 0.32 has no parser for it).
"""

import json
import zlib
from dataclasses import dataclass, field

from .errors import validation_error, vllm_error
from .tokenizer import IM_END, IM_START, tokenize

# Placeholder tokens a media item takes in the prompt. Real counts depend on the model and the
# item; these are plausible fixed sizes (Gemma 3 encodes an image as 256 soft tokens).
MEDIA_TOKENS = {"image": 256, "audio": 188, "video": 1024}

# Content part types and what they are: vLLM's MM_PARSER_MAP and its text-like types.
TEXT_PARTS = {"text", "input_text", "output_text", "refusal", "thinking"}
MEDIA_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "image_embeds": "image",
    "image_pil": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
}
_OTHER_PARTS = {"tool_reference", "prompt_embeds"}
_SUPPORTED = ", ".join(sorted(TEXT_PARTS | set(MEDIA_PARTS) | _OTHER_PARTS))
# A part without "type" is recognised by its key, as vLLM does.
_UNTYPED_KEYS = ("image_url", "image_pil", "image_embeds", "audio_url", "input_audio", "video_url")


@dataclass
class Prompt:
    tokens: list[str]
    media_tokens: dict[str, int] = field(default_factory=dict)  # placeholder tokens by modality
    echo_text: str = ""  # what echo mode repeats: the last user message, or the last tool result
    ends_with_tool_result: bool = False
    prefill: str | None = None  # the assistant's partial answer being continued


# vLLM's refusal (its Mistral and DeepSeek renderers; the one the gateway's prefill must not hit).
NOT_ASSISTANT_FINAL = (
    "Cannot set `continue_final_message` to True when the last message is not from the assistant."
)


def parse_messages(
    messages,
    tools: list[dict] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
) -> Prompt:
    """Validate chat messages like vLLM and render the simulated prompt."""
    if messages is None:
        raise validation_error("messages", "Field required", "missing", None)
    if not isinstance(messages, list):
        raise validation_error("messages", "Input should be a valid list", "list_type", messages)
    for index, message in enumerate(messages):
        _check_message(index, message)
    if continue_final and (not messages or messages[-1].get("role") != "assistant"):
        raise vllm_error(NOT_ASSISTANT_FINAL)
    return render(
        messages, tools, add_generation_prompt=add_generation_prompt, continue_final=continue_final
    )


def render(
    messages: list,
    tools: list[dict] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
) -> Prompt:
    """The tokens of a ChatML-style rendering, generation prompt included.

    Real chat templates count markers, tool definitions and tool calls as prompt tokens too; this
    gives each the same plausible overhead, so counts move the way a real server's do. /tokenize
    uses it unvalidated, so it tolerates any shape.

    With `continue_final` (vLLM's `continue_final_message`), the last message is left open, as
    transformers cuts the rendered chat right after its content: the model's answer goes on from
    there, and no generation prompt follows."""
    prompt = Prompt(tokens=[])
    tokens = prompt.tokens
    if tools:
        tokens += [IM_START, "system", "\n", "<tools>"]
        for tool in tools:
            tokens += tokenize("\n" + json.dumps(tool, ensure_ascii=False))
        tokens += ["\n", "</tools>", IM_END, "\n"]
    last_user = ""
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        tokens += [IM_START, role, "\n"]
        text = _content(message.get("content"), prompt)
        tokens += tokenize(text)
        if continue_final and number == len(messages):
            prompt.prefill = text
            return prompt
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                body = {"name": function.get("name"), "arguments": function.get("arguments")}
                tokens += ["<tool_call>", *tokenize("\n" + json.dumps(body)), "\n", "</tool_call>"]
        tokens += [IM_END, "\n"]
        if role == "user":
            last_user = text
        prompt.ends_with_tool_result = role == "tool"
        prompt.echo_text = text if role == "tool" else last_user
    if add_generation_prompt:
        tokens += [IM_START, "assistant", "\n"]
    return prompt


def _content(content, prompt: Prompt) -> str:
    """The text of a message's content; media parts add their placeholder tokens to the prompt."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = _part_type(part)
        if kind in TEXT_PARTS:
            text = part.get(kind if kind in ("refusal", "thinking") else "text")
            if isinstance(text, str):
                texts.append(text)
        elif kind in MEDIA_PARTS:
            modality = MEDIA_PARTS[kind]
            count = MEDIA_TOKENS[modality]
            # One placeholder id per item, so two different images do not share cache blocks.
            source = json.dumps(part.get(kind), sort_keys=True, default=str)
            placeholder = f"<|{modality}:{zlib.crc32(source.encode()):08x}|>"
            prompt.tokens += [placeholder] * count
            prompt.media_tokens[modality] = prompt.media_tokens.get(modality, 0) + count
        elif kind == "tool_reference" and isinstance(part.get("name"), str):
            texts.append(part["name"])
    return "\n".join(texts)


def _part_type(part: dict) -> str | None:
    kind = part.get("type")
    if kind is None:
        return next((key for key in _UNTYPED_KEYS if key in part), None)
    return kind if isinstance(kind, str) else None


def _check_message(index: int, message) -> None:
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise validation_error(where, "Input should be a valid dictionary", "dict_type", message)
    if "role" not in message:
        raise validation_error(f"{where}.role", "Field required", "missing", message)
    if not isinstance(message["role"], str):
        raise validation_error(
            f"{where}.role", "Input should be a valid string", "string_type", message["role"]
        )
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise validation_error(
            f"{where}.content", "Input should be a valid string", "string_type", content
        )
    for key in ("name", "tool_call_id", "refusal"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise validation_error(
                f"{where}.{key}", "Input should be a valid string", "string_type", value
            )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise validation_error(
                f"{where}.tool_calls", "Input should be a valid list", "list_type", tool_calls
            )
        for number, call in enumerate(tool_calls):
            _check_tool_call(f"{where}.tool_calls.{number}", call)
    if isinstance(content, list):
        for number, part in enumerate(content):
            _check_part(f"{where}.content.{number}", part)


def _check_tool_call(where: str, call) -> None:
    if not isinstance(call, dict):
        raise validation_error(where, "Input should be a valid dictionary", "dict_type", call)
    for key in ("id", "function"):
        if key not in call:
            raise validation_error(f"{where}.{key}", "Field required", "missing", call)
    function = call["function"]
    if not isinstance(function, dict):
        raise validation_error(
            f"{where}.function", "Input should be a valid dictionary", "dict_type", function
        )
    for key in ("name", "arguments"):
        if key not in function:
            raise validation_error(f"{where}.function.{key}", "Field required", "missing", function)
        if not isinstance(function[key], str):
            raise validation_error(
                f"{where}.function.{key}",
                "Input should be a valid string",
                "string_type",
                function[key],
            )


def _check_part(where: str, part) -> None:
    if isinstance(part, str):
        return
    if not isinstance(part, dict):
        raise validation_error(where, "Input should be a valid dictionary", "dict_type", part)
    kind = part.get("type")
    if kind is None:
        if not any(key in part for key in (*_UNTYPED_KEYS, "tool_reference")):
            raise vllm_error("Missing 'type' field in multimodal part.", parameter="type")
        return
    if not isinstance(kind, str):
        raise vllm_error("Invalid 'type' field in multimodal part.", parameter="type")
    if kind not in TEXT_PARTS and kind not in MEDIA_PARTS and kind not in _OTHER_PARTS:
        raise vllm_error(
            f"Unsupported chat content part type: {kind!r}. Supported types: {_SUPPORTED}.",
            parameter="type",
            value=kind,
        )
