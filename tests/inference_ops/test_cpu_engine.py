"""The CPU engine: llama.cpp's llama-server serving the bundled Gemma 3 270M, started and stopped
by the supervisor. Real processes, real HTTP, a real model; the first run builds llama-server
(docs/benchmarks.md#fig-cpu-engine-build) into the cache, later runs find it there."""

import asyncio
import contextlib
import time

import pytest

from inference_ops import cpu_engine, engine_command, engine_processes, probes, supervisor
from inference_ops.client import Finish, Token, stream_chat
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineProcess, ModelEndpoint
from tests.support.engines import unclaimed_port

pytestmark = pytest.mark.engines


def make_cpu_engine(name="cpu-test", *, port=None, **fields) -> EngineProcess:
    port = port or unclaimed_port()
    endpoint = ModelEndpoint.objects.create(
        name=name,
        kind="cpu",
        base_url=f"http://127.0.0.1:{port}/v1",
        model=fields.get("model", "gemma3-270m"),
        first_token_timeout=60,
        idle_timeout=30,
    )
    defaults = dict(
        kind="cpu",
        model="gemma3-270m",
        port=port,
        max_num_seqs=2,
        max_model_len=1024,
        startup_timeout=120,
        stop_timeout=10,
    )
    return EngineProcess.objects.create(name=name, endpoint=endpoint, **{**defaults, **fields})


@pytest.fixture
def fake_build(settings, tmp_path):
    """A cache with a llama-server and a model file in place, for command lines without a build."""
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.CPU_ENGINE_SERVER = ""
    settings.CPU_ENGINE_THREADS = 3
    server = tmp_path / "llama-server-0.3.36" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF")
    return tmp_path


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_bundled_model_is_served_with_the_question_answer_template_and_its_stops(fake_build):
    engine = make_cpu_engine(port=8081, max_num_seqs=4, max_model_len=2048)
    assert engine_command.command_line(engine) == [
        str(fake_build / "llama-server-0.3.36" / "llama-server"),
        "-m",
        str(fake_build / "models" / "gemma-3-270m-q4_k_m.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        "8081",
        "--alias",
        "gemma3-270m",
        "--parallel",
        "4",
        "--ctx-size",
        "8192",
        "--threads",
        "3",
        "--metrics",
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
def test_an_own_gguf_keeps_its_template_and_extra_arguments_come_last(fake_build, settings):
    settings.CPU_ENGINE_SERVER = str(fake_build / "llama-server-0.3.36" / "llama-server")
    gguf = fake_build / "qwen.gguf"
    gguf.write_bytes(b"GGUF")
    engine = make_cpu_engine(
        port=8090,
        model=str(gguf),
        served_model_name="qwen",
        max_num_seqs=None,
        max_model_len=None,
        bind_host="0.0.0.0",
        extra_args=["--threads", "1", "--seed", 7],
    )
    assert engine_command.command_line(engine) == [
        settings.CPU_ENGINE_SERVER,
        "-m",
        str(gguf),
        "--host",
        "0.0.0.0",
        "--port",
        "8090",
        "--alias",
        "qwen",
        "--parallel",
        "2",
        "--ctx-size",
        "4096",
        "--threads",
        "3",
        "--metrics",
        "--threads",
        "1",
        "--seed",
        "7",
    ]


@pytest.mark.django_db
def test_a_cpu_engine_that_is_not_built_fails_to_start_naming_the_command_that_builds_it(
    settings, tmp_path
):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.CPU_ENGINE_SERVER = ""
    engine = make_cpu_engine()
    with pytest.raises(SupervisorError, match=r"manage\.py cpu_engine_build"):
        supervisor.engine_start(engine_id=engine.pk)
    engine.refresh_from_db()
    assert engine.status == "crashed" and "llama-server is not built yet" in engine.status_reason


@pytest.mark.django_db
def test_a_missing_own_model_is_named(fake_build):
    engine = make_cpu_engine(model=str(fake_build / "nowhere.gguf"))
    with pytest.raises(SupervisorError, match=r"nowhere\.gguf does not exist"):
        engine_command.command_line(engine)


# --- the real engine ------------------------------------------------------------------------------


async def _answer(
    config: EndpointConfig, question: str, started: list | None = None, **options
) -> dict:
    """Stream one answer; note when its first token and its end arrived."""
    text, first, finish = [], None, None
    async with contextlib.aclosing(
        stream_chat(config, [{"role": "user", "content": question}], **options)
    ) as s:
        async for event in s:
            if isinstance(event, Token):
                if first is None:
                    first = time.monotonic()
                    if started is not None:
                        started.append(first)
                text.append(event.text)
            elif isinstance(event, Finish):
                finish = event
    return {"text": "".join(text), "first": first, "end": time.monotonic(), "finish": finish}


async def _two_at_once(config: EndpointConfig, engine: EngineProcess) -> tuple[dict, dict, dict]:
    """Two answers at once, and the engine's metrics scraped while both are streaming."""
    # 64 tokens each, whatever the model says: long enough that one would finish before the other
    # started if the engine served them one after the other.
    options = dict(
        max_tokens=64, temperature=0.0, stop=["<never>"], extra_body={"ignore_eos": True}
    )
    started: list[float] = []

    async def scrape() -> dict:
        while len(started) < 2:  # noqa: ASYNC110 - _answer appends to a list it is given
            await asyncio.sleep(0.01)
        healthy, _reason, metrics = await asyncio.to_thread(probes.probe, engine, 10.0)
        return {"healthy": healthy, "metrics": metrics, "at": time.monotonic()}

    return await asyncio.gather(
        _answer(config, "Tell me about Paris.", started, **options),
        _answer(config, "Tell me about Rome.", started, **options),
        scrape(),
    )


@pytest.mark.timeout(1200)
@pytest.mark.django_db
def test_the_cpu_engine_streams_real_answers_batches_two_requests_reports_metrics_and_stops_clean():
    cpu_engine.ensure_llama_server()  # the first run builds it: 10 minutes or more on 2 cores
    cpu_engine.ensure_model()
    engine = make_cpu_engine()
    engine = supervisor.engine_start(engine_id=engine.pk)
    pid = engine.pid
    try:
        assert engine.status == "ready"
        assert engine_processes.session_processes(pid)
        config = EndpointConfig.from_endpoint(engine.endpoint)

        # The question/answer template and the engine's own stops: a short answer, then a clean
        # stop.
        answer = asyncio.run(
            _answer(config, "What is the capital of France?", max_tokens=32, temperature=0.0)
        )
        assert "Paris" in answer["text"]
        assert "Question:" not in answer["text"] and "\n\n" not in answer["text"]
        assert (
            answer["finish"].finish_reason == "stop"
            and answer["finish"].usage.completion_tokens > 0
        )

        # Continuous batching: both answers are streaming before either is complete, and the
        # engine's metrics, scraped meanwhile, count two requests running.
        first, second, during = asyncio.run(_two_at_once(config, engine))
        assert (
            first["finish"].usage.completion_tokens
            == second["finish"].usage.completion_tokens
            == 64
        )
        assert max(first["first"], second["first"]) < min(first["end"], second["end"])
        assert during["at"] < min(first["end"], second["end"])
        assert (
            during["healthy"]
            and during["metrics"]["running"] == 2
            and during["metrics"]["waiting"] == 0
        )

        supervisor.engine_check(engine_id=engine.pk)
        engine.refresh_from_db()
        assert engine.status == "ready" and engine.last_check_ok
        assert engine.metrics["running"] == 0 and engine.metrics["waiting"] == 0
        engine.endpoint.refresh_from_db()
        assert engine.endpoint.status == "ready" and engine.endpoint.requests_running == 0
    finally:
        engine = supervisor.engine_stop(engine_id=engine.pk)
    assert engine.status == "stopped" and engine.pid is None
    assert engine_processes.session_processes(pid) == []
