"""The clients people put behind /v1, driving the real gateway (daphne) to the simulator, which
serves tools as vLLM does with a tool-call parser: the official SDK (tools, a tool-result turn,
`chat.completions.parse` with a pydantic model, its stream helper), LangChain's ChatOpenAI
(`bind_tools`, `with_structured_output`) and a pydantic-ai agent completing a two-step tool
loop. What each library asserts of the wire (ids, argument JSON, finish reasons, schema) is
checked by the library itself: a broken relay fails in it."""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.inference_ops.simulator_process import start_simulator
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db(transaction=True)

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
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Forecast(BaseModel):
    city: str = Field(min_length=1)
    degrees: int = Field(ge=-60, le=60)
    sunny: bool


@pytest.fixture(scope="module")
def tool_sim():
    """The local engine as `make run` has it: a vLLM (here the simulator) with a tool parser."""
    sim = start_simulator(
        "serve",
        "acme/local",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "2",
        "--mode",
        "echo",
    )
    yield sim
    sim.stop()


@pytest.fixture
def gateway(asgi_server, alice_key, tool_sim):
    local = endpoint("local", tool_sim)
    rule("default", local, is_default=True, use_kb_context=False)
    return f"{asgi_server}/v1", alice_key


def sdk(gateway) -> openai.OpenAI:
    url, key = gateway
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)


def test_the_sdk_gets_a_valid_tool_call_and_the_answer_to_its_result(gateway):
    client = sdk(gateway)
    first = client.chat.completions.create(model="auto", messages=ASK, tools=[WEATHER])
    (call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and call.id
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    # The tool's result goes back; the conversation ends with it, and the model reads it.
    second = client.chat.completions.create(
        model="auto",
        tools=[WEATHER],
        messages=[
            *ASK,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        ],
    )
    assert second.choices[0].finish_reason == "stop"
    assert "18 degrees and sunny" in second.choices[0].message.content


def test_the_sdks_stream_helper_assembles_the_streamed_call(gateway):
    with sdk(gateway).chat.completions.stream(
        model="auto",
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_the_sdks_parse_gets_an_instance_of_the_pydantic_model(gateway):
    completion = sdk(gateway).chat.completions.parse(
        model="auto",
        messages=[{"role": "user", "content": "Forecast Paris"}],
        response_format=Forecast,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Forecast)


def test_langchain_binds_tools_and_asks_for_a_structured_output(gateway):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city, in celsius or fahrenheit."""
        return f"18 degrees {unit} in {city}"

    url, key = gateway
    chat = ChatOpenAI(base_url=url, api_key=key, model="auto", max_retries=0, timeout=30)
    message = chat.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    forecast = chat.with_structured_output(Forecast).invoke("Forecast Paris")
    assert isinstance(forecast, Forecast)


def test_a_pydantic_ai_agent_completes_a_two_step_tool_loop(gateway):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    url, key = gateway
    agent = Agent(OpenAIChatModel("auto", provider=OpenAIProvider(base_url=url, api_key=key)))
    called = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return "18 degrees and sunny"

    result = agent.run_sync("What is the weather in Paris?")
    # Step one: the model called the tool; step two: it answered from the tool's result.
    assert len(called) == 1 and called[0]
    assert "18 degrees and sunny" in result.output
    kinds = [part.part_kind for message in result.all_messages() for part in message.parts]
    assert kinds.count("tool-call") == 1 and kinds.count("tool-return") == 1
