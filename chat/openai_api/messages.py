"""The messages of a chat completion request as this API reads them: each one checked (its role,
its content parts and the engine kinds that read them, its tool calls), and the conversation cut
into the system text, the history, the question and what follows it (chat.openai_api.schema)."""

from __future__ import annotations

from chat.openai_api.replies import Reply, error_reply
from core.text import text_problem
from inference_ops.openai_fields import ALL_KINDS, EXTERNAL, VLLM

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Content part types, by the roles that may send them, and the engine kinds that read them.
_PARTS = {
    "text": ("text", ALL_KINDS),
    "image_url": ("image_url", ALL_KINDS),
    "input_audio": ("input_audio", ALL_KINDS),
    "file": ("file", frozenset({EXTERNAL})),
    "refusal": ("refusal", ALL_KINDS),
    "audio_url": ("audio_url", frozenset({VLLM})),
    "video_url": ("video_url", frozenset({VLLM})),
}


def message_problem(message, index: int, limited: dict) -> Reply | None:
    where = f"messages[{index}]"

    def refused(why: str, code: str | None = None) -> Reply:
        return error_reply(400, f"{where} {why}", code=code, param=where)

    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        return refused(
            "needs a role (system, developer, user, assistant or tool) and content.",
        )
    role = message["role"]
    content = message.get("content")
    if role == "function":
        limited[f"{where} (a function message)"] = frozenset({EXTERNAL})
    if content is None:
        # Only an assistant turn that called a tool, refused, or spoke audio may say nothing.
        if role != "assistant" or not (
            message.get("tool_calls")
            or message.get("refusal")
            or message.get("audio")
            or message.get("function_call")
        ):
            return refused("needs content: a string or a list of content parts.")
    elif isinstance(content, str):
        if (problem := text_problem(content)) is not None:
            return refused(f"{problem}.", "invalid_text")
    elif isinstance(content, list) and content:
        for number, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _PARTS:
                return refused(
                    f"content[{number}] must be a part of type text, image_url, input_audio or "
                    "file."
                )
            key, kinds = _PARTS[part["type"]]
            if (
                part["type"] != "text"
                and role != "user"
                and not (part["type"] == "refusal" and role == "assistant")
            ):
                return refused(f"content[{number}]: a {role} message takes text parts only.")
            value = part.get(key)
            if part["type"] in ("text", "refusal"):
                if not isinstance(value, str):
                    return refused(f"content[{number}] needs its `{key}` as a string.")
                if (problem := text_problem(value)) is not None:
                    return refused(f"{problem} (content[{number}]).", "invalid_text")
            elif not isinstance(value, (dict, str)) or not value:
                return refused(f"content[{number}] needs its `{key}`.")
            if kinds != ALL_KINDS:
                limited[f"{where}.content[{number}] (a {part['type']} part)"] = kinds
    else:
        return refused("needs content: a string or a non-empty list of content parts.")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        return refused("is a tool result and needs the `tool_call_id` it answers.")
    calls = message.get("tool_calls")
    if calls is not None:
        if (
            role != "assistant"
            or not isinstance(calls, list)
            or not all(_tool_call_valid(call) for call in calls)
        ):
            return refused(
                "`tool_calls` belong to an assistant message: a list of {id, type: function, "
                "function: {name, arguments: a string}}."
            )
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        return refused("`name` must be a string.")
    return None


def _tool_call_valid(call) -> bool:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        return False
    if call.get("type", "function") == "custom":
        return isinstance(call.get("custom"), dict)
    function = call.get("function")
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    )


def split_conversation(messages: list[dict]):
    """(system text, history, question, after): the leading system and developer messages go
    with the rule's system prompt, the last user message is the question."""
    lead = 0
    system = []
    while lead < len(messages) and messages[lead]["role"] in ("system", "developer"):
        text = message_text(messages[lead])
        if text is None:
            return error_reply(
                400, f"messages[{lead}] is a system message: text only.", param=f"messages[{lead}]"
            )
        system.append(text)
        lead += 1
    last_user = None
    for index in range(len(messages) - 1, lead - 1, -1):
        if messages[index]["role"] == "user":
            last_user = index
            break
    if last_user is None:
        return "\n\n".join(system), list(messages[lead:]), None, []
    return (
        "\n\n".join(system),
        list(messages[lead:last_user]),
        messages[last_user],
        list(messages[last_user + 1 :]),
    )


def message_text(message: dict) -> str | None:
    """A message's text: its string, or its text parts joined; "" for none; None for a part
    list with something else than text in it, when text alone is asked for (system)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [part["text"] for part in content if part.get("type") == "text"]
    if message.get("role") in ("system", "developer") and len(texts) != len(content):
        return None
    return "\n".join(texts)
