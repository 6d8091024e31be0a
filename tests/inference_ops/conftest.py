import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"simulator ready on ([\w.\-:]+):(\d+) ")


@dataclass
class RunningSimulator:
    process: subprocess.Popen
    port: int
    output: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def launch_simulator(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inference_ops.simulator", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, stopped as a whole
    )


def start_simulator(*args: str, env: dict[str, str] | None = None, timeout: float = 15) -> RunningSimulator:
    """Start the simulator on a free port and wait for its ready line."""
    process = launch_simulator(*args, "--host", "127.0.0.1", "--port", "0", env=env)
    output: list[str] = []
    deadline = time.monotonic() + timeout
    port = None
    while port is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or process.poll() is not None:
            process.kill()
            raise RuntimeError("simulator did not become ready:\n" + "".join(output))
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if readable:
            line = process.stdout.readline()
            output.append(line)
            if match := READY.search(line):
                port = int(match.group(2))
    sim = RunningSimulator(process=process, port=port, output=output)

    def drain() -> None:
        # Keep reading so a full pipe never blocks the simulator's logging.
        for line in process.stdout:
            output.append(line)

    threading.Thread(target=drain, daemon=True).start()
    return sim


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
