"""Tool calling as vLLM 0.32 serves it.

Validation (entrypoints/openai/chat_completion/protocol.py, check_tool_usage): `tools` given
without `tool_choice` means "auto"; a tool_choice other than "none" needs `tools`; a named choice
must name one of them; an empty `tools` list is refused.

The server (renderers/online_renderer.py, render_chat): without a tool parser, which vLLM only
builds with both --enable-auto-tool-choice and --tool-call-parser, "auto" is a 400 naming both
flags, and "required" or a named function a 400 naming --tool-call-parser. "none" is served as
plain text either way.

The simulated model, deterministically: with tool_choice auto, required or named it calls a tool
(the named one, or the first) unless the conversation ends with a tool result, where "auto"
answers in text instead. Its arguments are a value of the tool's `parameters` schema.

What the client sees follows vLLM's Hermes parser (tool_parsers/hermes_tool_parser.py), whatever
--tool-call-parser names: the model writes `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
and the parser turns it into tool calls. With VLLM_ENFORCE_STRICT_TOOL_CALLING on (vLLM's
default) a parser with a structural tag, Hermes among them, parses "required" and named choices
that way too (supports_required_and_named is False). With it off, vLLM constrains those two to
plain JSON instead and streams them with tool_parsers/streaming.py: the arguments as they come
for a named function, the `[{"name", "parameters"}]` array for "required".

Streamed (chat_completion/serving.py, chat_completion_stream_generator): the first tool-call delta
carries the call's id (chatcmpl-tool-...), type and function name, later ones argument fragments;
finish_reason is "tool_calls" for auto and required, and the engine's own ("stop") for a named
function. Not streamed (chat_completion_full_generator): `tool_calls` with content null for auto,
content "" for required and named; the same finish reasons.
"""

import json
import os
import random
import re
from dataclasses import dataclass, field

from .errors import APIError, validation_error, vllm_error
from .tokenizer import tokenize

STRICT_TOOL_CALLING_ENV = "VLLM_ENFORCE_STRICT_TOOL_CALLING"

# vLLM 0.32's registered tool parsers (tool_parsers/__init__.py); another name fails its start.
TOOL_PARSERS = frozenset(
    "dots deepseek_v3 deepseek_v31 deepseek_v32 deepseek_v4 deepseek_v41 cohere_command3 "
    "cohere_command4 ernie45 glm45 glm47 ling3 granite-20b-fc granite granite4 hermes hf "
    "poolside_v1 hunyuan_a13b hy_v3 hy_v4 internlm jamba lfm2 kimi_k2 kimi_k3 k2_horizon "
    "llama3_json llama4_json llama4_pythonic longcat mimo minimax_m2 minimax_m3 minicpm5 mistral "
    "olmo3 plamo3 muse_glimmer openai phi4_mini_json pythonic qwen3_coder qwen3_json qwen3_xml "
    "seed_oss step3 step3p5 inkling xlam gigachat3 functiongemma gemma4 apertus".split()
)

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_CORRECT_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
_MISSING = object()


# Ids only need to be unique; a generator of their own keeps them off the seeded text streams and
# costs a fraction of uuid4 on the hot path.
_IDS = random.Random(os.urandom(16))


def random_uuid() -> str:
    """vLLM's random_uuid: 16 hex digits (request ids, tool call ids)."""
    return f"{_IDS.getrandbits(64):016x}"


def tool_call_id() -> str:
    return f"chatcmpl-tool-{random_uuid()}"


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]
    choice: str | None  # "none", "auto", "required", "named" or None (an explicit null)
    named: str | None = None  # the function a named choice names


@dataclass(frozen=True)
class ToolCallPlan:
    """The call the simulated model makes, and the text it writes for it."""

    name: str
    mode: str  # "auto", "required" or "named": the request's tool_choice
    wire: str  # "hermes" (the parser's format) or "json" (vLLM's own JSON for required/named)
    arguments: str  # the arguments as the model writes them: a JSON object
    text: str = field(init=False)
    name_end: int = field(init=False)  # where the function name is complete in `text`
    args_start: int = field(init=False)
    args_end: int = field(init=False)

    def __post_init__(self):
        name = json.dumps(self.name, ensure_ascii=False)
        if self.wire == "hermes":
            prefix, close = '<tool_call>\n{"name": ', ', "arguments": '
            suffix = "}\n</tool_call>"
        elif self.mode == "named":
            prefix, close, suffix, name = "", "", "", ""
        else:
            prefix, close, suffix = '[{"name": ', ', "parameters": ', "}]"
        head = prefix + name + close
        object.__setattr__(self, "text", head + self.arguments + suffix)
        object.__setattr__(self, "name_end", len(prefix + name))
        object.__setattr__(self, "args_start", len(head))
        object.__setattr__(self, "args_end", len(head) + len(self.arguments))

    def tokens(self) -> list[str]:
        if self.wire == "hermes":
            # <tool_call> and </tool_call> are single special tokens in Hermes-style vocabularies.
            body = self.text[len("<tool_call>\n") : -len("\n</tool_call>")]
            return ["<tool_call>", "\n", *tokenize(body), "\n", "</tool_call>"]
        return tokenize(self.text)


def parse(body: dict) -> ToolRequest | None:
    """`tools` and `tool_choice` validated as vLLM validates them; None when there are none."""
    tools = body.get("tools")
    if tools == []:
        raise vllm_error(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            parameter="tools",
        )
    choice = body.get("tool_choice", _MISSING)
    if choice is _MISSING:
        choice = "auto" if tools else "none"
    if choice not in ("none", None):
        if tools is None:
            raise vllm_error(
                "When using `tool_choice`, `tools` must be set.", parameter="tool_choice"
            )
        if choice not in ("auto", "required") and not isinstance(choice, dict):
            raise vllm_error(
                f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                '"none", "auto" or "required" are supported.',
                parameter="tool_choice",
            )
    named = _named_choice(choice, tools) if isinstance(choice, dict) else None
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise validation_error("tools", "Input should be a valid list", "list_type", tools)
    for index, tool in enumerate(tools):
        _check_tool(index, tool)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise validation_error(
            "parallel_tool_calls", "Input should be a valid boolean", "bool_type", parallel
        )
    return ToolRequest(tools=tools, choice="named" if named else choice, named=named)


def check_server(request: ToolRequest | None, *, parser: str | None) -> None:
    """The 400s of a server that has no tool parser (vLLM's render_chat)."""
    if parser is not None or request is None or request.choice in ("none", None):
        return
    if request.choice == "auto":
        raise APIError(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    what = f'function "{request.named}"' if request.named else f'"{request.choice}"'
    raise APIError(f"tool_choice={what} requires --tool-call-parser to be set")


def plan_call(
    request: ToolRequest | None, *, ends_with_tool_result: bool, strict: bool
) -> tuple[str, dict | None, str, str] | None:
    """Whether the model calls a tool: (function name, its parameters schema, mode, wire)."""
    if request is None or request.choice not in ("auto", "required", "named"):
        return None
    if request.choice == "auto" and ends_with_tool_result:
        return None  # the tool has answered: the model answers the user
    functions = [tool["function"] for tool in request.tools]
    function = next((f for f in functions if f["name"] == request.named), functions[0])
    wire = "hermes" if strict or request.choice == "auto" else "json"
    return function["name"], function.get("parameters"), request.choice, wire


class ToolStream:
    """The tool-call deltas of one streamed choice, as vLLM's parsers cut them."""

    def __init__(self, plan: ToolCallPlan, text: str):
        self.plan = plan
        self.text = text  # what was generated: the plan's text, or a prefix of it
        self.name_sent = False
        self.args_sent = 0  # characters of the arguments sent so far
        self.called = False  # vLLM's tools_streamed

    def delta(self, end: int, new_text: str) -> dict | None:
        """The delta for the text generated up to `end` (`new_text` is what the step added)."""
        plan = self.plan
        calls: list[dict] = []
        if plan.wire == "json" and plan.mode == "named":
            # extract_named_tool_call_streaming: every step's text is an arguments fragment.
            if self.name_sent:
                calls.append({"index": 0, "function": {"arguments": new_text}})
            else:
                self.name_sent = True
                calls.append(self._opening({"name": plan.name, "arguments": new_text}))
            self.called = True
            return {"tool_calls": calls}
        args_now = min(max(end, plan.args_start), plan.args_end) - plan.args_start
        new_args = self.text[plan.args_start + self.args_sent : plan.args_start + args_now]
        if plan.wire == "hermes":
            # Hermes2ProToolParser.extract_tool_calls_streaming: the name once it is complete,
            # then whatever the arguments grew by; its deltas carry content explicitly null.
            if not self.name_sent and end >= plan.name_end:
                self.name_sent = True
                calls.append(self._opening({"name": plan.name}))
            if self.name_sent and new_args:
                self.args_sent = args_now
                calls.append({"index": 0, "function": {"arguments": new_args}})
            if not calls:
                return None
            self.called = True
            return {"content": None, "tool_calls": calls}
        # extract_required_tool_call_streaming: a call is announced when its name is complete
        # and its parameters have begun, with the arguments so far; then fragments.
        if end < plan.name_end or end <= plan.args_start:
            return None
        if not self.name_sent:
            self.name_sent, self.args_sent = True, args_now
            calls.append(self._opening({"name": plan.name, "arguments": new_args}))
        elif new_args:
            self.args_sent = args_now
            calls.append({"index": 0, "function": {"name": None, "arguments": new_args}})
        else:
            return None
        self.called = True
        return {"tool_calls": calls}

    def finish_reason(self, engine_reason: str) -> str:
        if self.called and self.plan.mode != "named" and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    @staticmethod
    def _opening(function: dict) -> dict:
        return {"id": tool_call_id(), "type": "function", "index": 0, "function": function}


def final_message(plan: ToolCallPlan, text: str, engine_reason: str) -> tuple:
    """(content, tool_calls, finish_reason) of a non-streamed answer that was to call a tool:
    `text` is what the model generated, cut short when max_tokens or a stop string struck."""
    calls: list[dict] = []
    if plan.wire == "hermes":
        content: str | None = text
        found = _HERMES_CALL.findall(text) if "<tool_call>" in text else []
        try:
            for complete, partial in found:
                call = json.loads(complete or partial)
                calls.append(_call(call["name"], json.dumps(call["arguments"], ensure_ascii=False)))
            if found:
                content = text[: text.find("<tool_call>")] or None
        except (ValueError, KeyError, TypeError):
            calls, content = [], text  # unparsable (cut short): the raw text comes back
    elif plan.mode == "named":
        if text.strip():
            calls.append(_call(plan.name, text))
        content = None
    else:
        try:
            for call in json.loads(text):
                calls.append(
                    _call(call["name"], json.dumps(call["parameters"], ensure_ascii=False))
                )
        except (ValueError, KeyError, TypeError):
            calls = []
        content = None
    if plan.mode == "auto":
        return content, calls, "tool_calls" if calls else engine_reason
    # vLLM's named/required branch: content "" rather than null.
    if plan.mode == "required" and engine_reason == "stop":
        return content or "", calls, "tool_calls"
    return content or "", calls, engine_reason


def _call(name: str, arguments: str) -> dict:
    return {
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _named_choice(choice: dict, tools) -> str:
    function = choice.get("function")
    if not isinstance(function, dict):
        raise vllm_error(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {_CORRECT_USAGE}",
            parameter="tool_choice.function",
        )
    if "name" not in function:
        raise vllm_error(
            f"Expected field `name` in `function` in `tool_choice`! {_CORRECT_USAGE}",
            parameter="tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise vllm_error(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_CORRECT_USAGE}",
            parameter="tool_choice.function.name",
        )
    known = [
        tool.get("function", {}).get("name")
        for tool in tools
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    if name not in known:
        raise vllm_error(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            parameter="tool_choice",
        )
    if choice.get("type", "function") != "function":
        raise validation_error(
            "tool_choice.type", "Input should be 'function'", "literal_error", choice.get("type")
        )
    return name


def _check_tool(index: int, tool) -> None:
    where = f"tools.{index}"
    if not isinstance(tool, dict):
        raise validation_error(where, "Input should be a valid dictionary", "dict_type", tool)
    if tool.get("type", "function") != "function":
        raise validation_error(
            f"{where}.type", "Input should be 'function'", "literal_error", tool.get("type")
        )
    function = tool.get("function")
    if function is None:
        raise validation_error(f"{where}.function", "Field required", "missing", tool)
    if not isinstance(function, dict):
        raise validation_error(
            f"{where}.function", "Input should be a valid dictionary", "dict_type", function
        )
    if not isinstance(function.get("name"), str):
        raise validation_error(f"{where}.function.name", "Field required", "missing", function)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise validation_error(
            f"{where}.function.parameters",
            "Input should be a valid dictionary",
            "dict_type",
            parameters,
        )
