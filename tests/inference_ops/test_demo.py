"""The demo data's local road (`make run`): which engine row serves the endpoint `local`."""

import pytest

from inference_ops import cpu_engine, demo
from inference_ops.models import EngineProcess, ModelEndpoint

# --- the demo rows --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_demo_points_the_local_road_at_the_cpu_engine_and_can_run_twice(settings):
    settings.CPU_ENGINE_MODEL = ""
    settings.CPU_ENGINE_CHAT_TEMPLATE = ""
    settings.LOCAL_VLLM_URL = None
    settings.LOCAL_ENGINE = "cpu"
    settings.CPU_ENGINE_PORT, settings.CPU_ENGINE_PARALLEL, settings.CPU_ENGINE_CTX_PER_SLOT = (
        8081,
        3,
        2048,
    )
    demo.demo_engine_ensure()
    engine = demo.demo_engine_ensure()
    assert EngineProcess.objects.count() == 1 and ModelEndpoint.objects.count() == 1
    assert (
        engine.name,
        engine.kind,
        engine.model,
        engine.api_name,
        engine.port,
        engine.max_num_seqs,
        engine.max_model_len,
        engine.desired_state,
        engine.status,
    ) == ("local-cpu", "cpu", "gemma3-270m", "gemma3-270m", 8081, 3, 2048, "running", "stopped")
    endpoint = engine.endpoint
    assert (
        endpoint.name,
        endpoint.kind,
        endpoint.base_url,
        endpoint.model,
        endpoint.context_window,
    ) == ("local", "cpu", "http://127.0.0.1:8081/v1", "gemma3-270m", 2048)


@pytest.mark.django_db
def test_the_demo_serves_an_own_base_model_with_the_question_answer_template(settings):
    settings.CPU_ENGINE_MODEL = "/models/my-base.gguf"
    settings.CPU_ENGINE_CHAT_TEMPLATE = "qa"
    settings.LOCAL_VLLM_URL, settings.LOCAL_ENGINE = None, "cpu"
    engine = demo.demo_engine_ensure()
    assert (engine.model, engine.api_name, engine.endpoint.model) == (
        "/models/my-base.gguf",
        "my-base",
        "my-base",
    )
    assert engine.extra_args == [
        "--chat-template-file",
        str(cpu_engine.QA_TEMPLATE),
        "--reverse-prompt",
        "\nQuestion:",
        "--reverse-prompt",
        "\n\n",
        "--dry-multiplier",
        "0.8",
    ]


@pytest.mark.django_db
def test_with_a_vllm_url_the_local_road_is_that_server_and_the_cpu_engine_is_parked(settings):
    settings.CPU_ENGINE_MODEL, settings.CPU_ENGINE_CHAT_TEMPLATE, settings.LOCAL_VLLM_URL = (
        "",
        "",
        None,
    )
    settings.LOCAL_ENGINE = "cpu"
    demo.demo_engine_ensure()
    settings.LOCAL_VLLM_URL, settings.LOCAL_VLLM_MODEL = "http://gpu-host:8000/v1", "qwen3"
    assert demo.demo_engine_ensure() is None
    local = ModelEndpoint.objects.get(name="local")
    assert (local.kind, local.base_url, local.model, local.active) == (
        "vllm",
        "http://gpu-host:8000/v1",
        "qwen3",
        True,
    )
    engine = EngineProcess.objects.get(name="local-cpu")
    assert engine.desired_state == "stopped"
    assert (engine.endpoint.name, engine.endpoint.active) == ("local-cpu", False)
    # And back: the CPU engine is the local road again.
    settings.LOCAL_VLLM_URL = None
    engine = demo.demo_engine_ensure()
    assert (
        engine.endpoint.name == "local"
        and engine.endpoint.kind == "cpu"
        and engine.desired_state == "running"
    )


@pytest.mark.django_db
def test_by_default_the_local_road_is_the_real_vllm_serving_the_converted_model(settings):
    settings.LOCAL_VLLM_URL, settings.LOCAL_ENGINE = None, "vllm"
    settings.VLLM_ENGINE_PORT, settings.VLLM_ENGINE_MAX_SEQS, settings.VLLM_ENGINE_CONTEXT = (
        8082,
        16,
        2048,
    )
    settings.VLLM_ENGINE_KV_CACHE_MB = 512
    demo.demo_engine_ensure()
    engine = demo.demo_engine_ensure()
    assert EngineProcess.objects.count() == 1
    assert (
        engine.name,
        engine.kind,
        engine.model,
        engine.api_name,
        engine.port,
        engine.max_num_seqs,
        engine.max_model_len,
        engine.extra_args,
        engine.desired_state,
    ) == (
        "local-vllm",
        "vllm",
        "gemma3-270m",
        "gemma3-270m",
        8082,
        16,
        2048,
        ["--kv-cache-memory-bytes", str(512 * 1024 * 1024)],
        "running",
    )
    assert (
        engine.endpoint.name,
        engine.endpoint.kind,
        engine.endpoint.base_url,
        engine.endpoint.model,
    ) == ("local", "vllm", "http://127.0.0.1:8082/v1", "gemma3-270m")


@pytest.mark.django_db
def test_switching_engines_parks_the_other_one_and_switching_back_restores_it(settings):
    settings.LOCAL_VLLM_URL, settings.LOCAL_ENGINE = None, "cpu"
    settings.CPU_ENGINE_MODEL, settings.CPU_ENGINE_CHAT_TEMPLATE = "", ""
    demo.demo_engine_ensure()
    settings.LOCAL_ENGINE = "vllm"
    vllm = demo.demo_engine_ensure()
    cpu = EngineProcess.objects.get(name="local-cpu")
    assert vllm.endpoint.name == "local" and vllm.desired_state == "running"
    assert (cpu.endpoint.name, cpu.endpoint.active, cpu.desired_state) == (
        "local-cpu",
        False,
        "stopped",
    )
    settings.LOCAL_ENGINE = "cpu"
    cpu = demo.demo_engine_ensure()
    vllm.refresh_from_db()
    assert (
        cpu.endpoint.name == "local"
        and cpu.endpoint.kind == "cpu"
        and cpu.desired_state == "running"
    )
    assert (vllm.endpoint.name, vllm.endpoint.active, vllm.desired_state) == (
        "local-vllm",
        False,
        "stopped",
    )
    assert (
        ModelEndpoint.objects.get(name="local").base_url
        == f"http://127.0.0.1:{settings.CPU_ENGINE_PORT}/v1"
    )


@pytest.mark.django_db
def test_the_local_vllm_endpoint_sends_the_key_the_server_requires(settings, monkeypatch):
    from inference_ops.endpoint_calls import EndpointConfig

    settings.LOCAL_VLLM_URL, settings.LOCAL_VLLM_MODEL = "http://vllm:8000/v1", "base"
    settings.LOCAL_VLLM_KEY_ENV = "GW_KEY_VLLM"
    monkeypatch.setenv("GW_KEY_VLLM", "sk-vllm")
    demo.demo_engine_ensure()
    local = ModelEndpoint.objects.get(name="local")
    assert local.api_key_env == "GW_KEY_VLLM"
    assert EndpointConfig.from_endpoint(local).api_key == "sk-vllm"
