"""Engine supervision with the simulator as the engine process: real processes, real HTTP."""

import json
import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from inference_ops import engine_command, engine_keys, engine_processes, lora, probes, supervisor
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.models import EngineEvent, EngineProcess, LoraAdapter
from inference_ops.tasks import engine_check_task, engine_start_task
from tests.support.answers import ask
from tests.support.engines import (  # noqa: F401 (an autouse fixture)
    check_until,
    make_engine,
    processes_on,
    stop_engines_afterwards,
)
from tests.support.factories import rule
from tests.support.polling import wait_until

pytestmark = pytest.mark.processes


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_vllm_command_line_is_built_from_the_row(settings):
    settings.VLLM_EXECUTABLE = "/opt/vllm/bin/vllm"
    engine = make_engine(
        kind="vllm",
        model="Qwen/Qwen3-8B",
        served_model_name="qwen3",
        port=8001,
        bind_host="0.0.0.0",
        max_model_len=8192,
        gpu_memory_utilization=0.9,
        max_num_seqs=128,
        tensor_parallel_size=2,
        quantization="awq",
        dtype="bfloat16",
        enable_prefix_caching=True,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
        extra_args=["--seed", "1"],
        runtime_lora_updating=True,
        environment={"HF_HOME": "/data"},
    )
    LoraAdapter.objects.create(engine=engine, name="sql", path="/adapters/sql")
    LoraAdapter.objects.create(
        engine=engine, name="legal", path="/adapters/legal", base_model="qwen3"
    )
    LoraAdapter.objects.create(engine=engine, name="later", path="/adapters/later", static=False)
    assert engine_command.command_line(engine) == [
        "/opt/vllm/bin/vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
        "--served-model-name",
        "qwen3",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-seqs",
        "128",
        "--tensor-parallel-size",
        "2",
        "--quantization",
        "awq",
        "--dtype",
        "bfloat16",
        "--enable-prefix-caching",
        "--enable-lora",
        "--max-loras",
        "4",
        "--max-lora-rank",
        "64",
        "--lora-modules",
        '{"name":"legal","path":"/adapters/legal","base_model_name":"qwen3"}',
        '{"name":"sql","path":"/adapters/sql"}',
        "--seed",
        "1",
    ]
    env = engine_command.environment(engine)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["HF_HOME"] == "/data"


@pytest.mark.django_db
def test_a_minimal_vllm_row_leaves_every_option_to_vllm(settings):
    settings.VLLM_EXECUTABLE = "vllm"
    engine = make_engine(
        kind="vllm", model="meta-llama/Llama-3.1-8B-Instruct", port=8002, extra_args=[]
    )
    assert engine_command.command_line(engine) == [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8002",
        "--enable-prefix-caching",  # said both ways: vLLM's default, and the row's
    ]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_command.environment(
        engine
    ) or os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")


@pytest.mark.django_db
def test_the_simulator_gets_the_same_vllm_arguments():
    engine = make_engine(port=8003, max_num_seqs=4, enable_lora=True, extra_args=[])
    LoraAdapter.objects.create(engine=engine, name="sql", path="/adapters/sql")
    argv = engine_command.command_line(engine)
    assert argv[1:3] == ["-m", "inference_ops.simulator"]
    assert argv[3:] == [
        "serve",
        "acme/base",
        "--host",
        "127.0.0.1",
        "--port",
        "8003",
        "--max-num-seqs",
        "4",
        "--enable-prefix-caching",
        "--enable-lora",
        "--lora-modules",
        '{"name":"sql","path":"/adapters/sql"}',
    ]


def test_metrics_of_vllm_and_llama_cpp_map_to_the_same_gauges():
    vllm = (
        'vllm:num_requests_running{model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{model_name="m"} 1.0\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n# HELP x\nvllm:prompt_tokens_total 10\n'
    )
    llama = (
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n"
        "llamacpp:kv_cache_usage_ratio 0.5\n"
    )
    assert probes.parse_metrics(vllm) == {
        "running": 3.0,
        "waiting": 1.0,
        "kv_cache_usage": 0.25,
    }
    assert probes.parse_metrics(llama) == {
        "running": 2.0,
        "waiting": 0.0,
        "kv_cache_usage": 0.5,
    }


def test_metrics_with_timestamps_and_labels_holding_spaces_are_read_right():
    """Hand-parsed, the timestamp was taken for the value and a label with a space cut the line."""
    text = (
        'vllm:num_requests_running{model_name="a b"} 3 1764600000000\n'
        'vllm:num_requests_waiting{model_name="a b",note="x } y"} 1.0\n'
    )
    assert probes.parse_metrics(text) == {"running": 3.0, "waiting": 1.0}
    assert probes.parse_metrics(text + "this is not a metric {\n") == {
        "running": 3.0,
        "waiting": 1.0,
    }


# --- start and stop -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start_waits_for_readiness_and_stop_leaves_no_process():
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    assert engine.status == "ready" and engine_processes.process_alive(engine.pid)
    engine.endpoint.refresh_from_db()
    assert engine.endpoint.status == "ready"
    session = engine_processes.session_processes(engine.pid)
    assert session

    engine = supervisor.engine_stop(engine_id=engine.pk)
    assert engine.status == "stopped" and engine.pid is None
    assert not any(p.is_running() and p.status() != "zombie" for p in session)
    assert not processes_on(engine.port)
    assert [e.status for e in EngineEvent.objects.filter(engine=engine).order_by("pk")] == [
        "starting",
        "ready",
        "stopped",
    ]


@pytest.mark.django_db
def test_a_started_engine_requires_its_key_which_the_gateway_and_the_checks_send():
    """The supervisor starts an engine with a key of its own (from the environment, where `ps`
    does not show it): whatever reaches the port without it is refused, and the gateway's calls
    (routed by the rules), the supervisor's checks and the adapters' loads carry it."""
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    key = EndpointConfig.from_endpoint(engine.endpoint).api_key  # what routing sends
    environ = dict(
        item.split(b"=", 1)
        for item in Path(f"/proc/{engine.pid}/environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    assert len(key) == 64 and environ[b"VLLM_API_KEY"] == key.encode()
    assert key not in " ".join(psutil.Process(engine.pid).cmdline())
    assert key not in repr(EndpointConfig.from_endpoint(engine.endpoint))  # nor in a log line

    models = f"{engine.base_url}/v1/models"
    assert probes._get(models, 2)[0] == 401
    assert probes._get(models, 2, {"Authorization": "Bearer EMPTY"})[0] == 401
    assert probes._get(models, 2, {"Authorization": f"Bearer {key}"})[0] == 200
    assert probes._get(f"{engine.base_url}/health", 2)[0] == 200  # as vLLM's, unguarded
    assert supervisor.engine_check(engine_id=engine.pk) is None  # healthy: nothing to do
    checked = EngineProcess.objects.get(pk=engine.pk)
    assert (checked.status, checked.last_check_ok) == ("ready", True)

    rule("default", engine.endpoint, is_default=True, use_kb_context=False)
    events = ask("Hello", max_tokens=3)
    assert [e.type for e in events][-1] == "done" and events[-1].road == "local"


@pytest.mark.django_db
def test_each_engine_kind_gets_its_key_in_the_variable_it_reads():
    for kind, variable in (
        ("vllm", "VLLM_API_KEY"),
        ("simulator", "VLLM_API_KEY"),
        ("cpu", "LLAMA_API_KEY"),
    ):
        engine = make_engine(name=f"keyed-{kind}", kind=kind)
        assert engine_keys.key_environment(engine) == {variable: engine.endpoint.api_key}
    other = make_engine(name="other")
    assert other.endpoint.api_key != engine.endpoint.api_key  # one key per endpoint


@pytest.mark.django_db
def test_start_refuses_a_port_that_is_taken():
    engine = make_engine()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", engine.port))
        squatter.listen()
        with pytest.raises(EngineStartRefused, match="held by a process the gateway did not"):
            supervisor.engine_start(engine_id=engine.pk)
    engine.refresh_from_db()
    assert engine.status == "port_taken" and f"pid {os.getpid()}" in engine.status_reason
    assert not processes_on(engine.port)


@pytest.mark.django_db
def test_an_engine_that_exits_during_start_up_is_crashed_with_its_log():
    engine = make_engine(extra_args=["--max-num-seqs", "0"])
    with pytest.raises(SupervisorError, match="exited during start-up"):
        supervisor.engine_start(engine_id=engine.pk)
    engine.refresh_from_db()
    assert engine.status == "crashed"
    assert "--max-num-seqs must be at least 1" in engine.status_reason
    assert "--max-num-seqs must be at least 1" in engine_processes.log_tail(engine)


@pytest.mark.django_db(transaction=True)
def test_concurrent_start_requests_launch_one_process():
    engine = make_engine()
    results = []

    def start():
        from django.db import connection

        try:
            results.append(supervisor.engine_start(engine_id=engine.pk).status)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    wait_until(lambda: EngineProcess.objects.get(pk=engine.pk).status == "ready")
    assert len(processes_on(engine.port)) == 1
    assert "ready" in results


# --- health, crashes, restarts --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_killed_engine_is_restarted_by_the_worker_and_ready_again(celery_worker):
    engine = make_engine()
    assert engine_start_task.apply_async((engine.pk,), queue="ops").get(timeout=60) == "ready"
    engine.refresh_from_db()
    old_pid = engine.pid
    os.kill(old_pid, signal.SIGKILL)

    def restarted():
        engine_check_task.apply_async((engine.pk,), queue="ops").get(timeout=30)
        current = EngineProcess.objects.get(pk=engine.pk)
        return current if current.status == "ready" and current.pid != old_pid else None

    current = wait_until(restarted, timeout=60, step=0.3)
    assert current, list(EngineEvent.objects.filter(engine=engine).values_list("status", "reason"))
    statuses = list(
        EngineEvent.objects.filter(engine=engine).order_by("pk").values_list("status", flat=True)
    )
    assert statuses[-3:] == ["restarting", "starting", "ready"]
    assert (
        "the process exited; automatic restart 1/5"
        in EngineEvent.objects.get(engine=engine, status="restarting").reason
    )
    assert len(processes_on(engine.port)) == 1


@pytest.mark.django_db
def test_a_clean_exit_still_counts_as_a_failure():
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    old_pid = engine.pid
    os.kill(old_pid, signal.SIGTERM)  # the simulator exits with status 0
    wait_until(lambda: not engine_processes.process_alive(old_pid))
    assert check_until(engine, "restarting")
    current = check_until(engine, "ready")
    assert current and current.pid != old_pid


@pytest.mark.django_db
def test_a_hung_engine_turns_unhealthy_then_is_killed_and_restarted():
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    os.kill(engine.pid, signal.SIGSTOP)  # alive, but answers nothing
    unhealthy = check_until(engine, "unhealthy")
    assert unhealthy and "failed check" in unhealthy.status_reason
    unhealthy.endpoint.refresh_from_db()
    assert unhealthy.endpoint.status == "unhealthy"
    current = check_until(engine, "ready")
    assert current and current.pid != engine.pid
    assert EngineEvent.objects.filter(engine=engine, reason__contains="killed").exists()


@pytest.mark.django_db
def test_checks_scrape_metrics_onto_the_engine_and_its_endpoint():
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    supervisor.engine_check(engine_id=engine.pk)
    engine.refresh_from_db()
    assert set(engine.metrics) == {
        "running",
        "waiting",
        "kv_cache_usage",
        "prefix_cache_queries",
        "prefix_cache_hits",
    }
    engine.endpoint.refresh_from_db()
    assert engine.endpoint.requests_running == 0 and engine.endpoint.checked_at is not None


@pytest.mark.django_db
def test_the_restart_budget_stops_automatic_restarts(settings):
    settings.ENGINE_RESTART_BUDGET = 1
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    os.kill(engine.pid, signal.SIGKILL)
    engine = check_until(engine, "ready")
    os.kill(engine.pid, signal.SIGKILL)
    crashed = check_until(engine, "crashed")
    assert crashed and "restart budget exhausted (1 in 600s)" in crashed.status_reason
    assert supervisor.engine_check(engine_id=engine.pk) is None
    assert EngineProcess.objects.get(pk=engine.pk).status == "crashed"
    # What keeps it down is a fact on the row, not the words of its reason.
    EngineProcess.objects.filter(pk=engine.pk).update(status_reason="crashed")
    assert supervisor.engine_check(engine_id=engine.pk) is None
    # An operator's restart resets the budget.
    assert supervisor.engine_restart(engine_id=engine.pk).status == "ready"


# --- LoRA adapters --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_runtime_adapters_load_unload_report_errors_and_return_after_a_restart():
    engine = make_engine(enable_lora=True, runtime_lora_updating=True)
    adapter = LoraAdapter.objects.create(
        engine=engine, name="legal", path="/adapters/legal", static=False
    )
    engine = supervisor.engine_start(engine_id=engine.pk)

    lora.adapter_load(adapter=adapter)
    assert adapter.state == "loaded"
    _, body = probes._get(f"{engine.base_url}/v1/models", 2, engine_keys.auth_headers(engine))
    assert b'"legal"' in body

    with pytest.raises(SupervisorError, match="HTTP 400"):
        lora.adapter_load(adapter=adapter)  # already loaded: the engine refuses
    adapter.refresh_from_db()
    assert adapter.state == "error" and "HTTP 400" in adapter.error

    adapter.state = "loaded"
    adapter.save()
    engine = supervisor.engine_restart(engine_id=engine.pk)
    _, body = probes._get(f"{engine.base_url}/v1/models", 2, engine_keys.auth_headers(engine))
    assert b'"legal"' in body  # reloaded after the restart

    lora.adapter_unload(adapter=adapter)
    assert adapter.state == "unloaded"
    ghost = LoraAdapter.objects.create(engine=engine, name="ghost", path="/x", static=False)
    with pytest.raises(SupervisorError, match="HTTP 404"):
        lora.adapter_unload(adapter=ghost)


@pytest.mark.django_db
def test_a_runtime_adapter_route_refuses_whoever_has_not_the_engines_key():
    """The hole: an engine loading adapters at run time loads one from any path it is sent. Only
    the gateway, which holds the key, may send one."""
    engine = supervisor.engine_start(
        engine_id=make_engine(enable_lora=True, runtime_lora_updating=True).pk
    )
    status, _body = lora._post(
        engine, "/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": "/adapters/mine"}
    )
    assert status == 200  # the gateway's own call, with the key
    request = urllib.request.Request(
        f"{engine.base_url}/v1/load_lora_adapter",
        data=json.dumps({"lora_name": "theirs", "lora_path": "/etc"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 401
    _, listed = probes._get(f"{engine.base_url}/v1/models", 2, engine_keys.auth_headers(engine))
    assert b'"mine"' in listed and b'"theirs"' not in listed


@pytest.mark.django_db
def test_loading_at_run_time_needs_the_engine_to_allow_it():
    engine = make_engine(enable_lora=True)
    adapter = LoraAdapter.objects.create(
        engine=engine, name="legal", path="/adapters/legal", static=False
    )
    with pytest.raises(SupervisorError, match="does not allow runtime LoRA updates"):
        lora.adapter_load(adapter=adapter)
