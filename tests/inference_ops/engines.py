"""The real vLLM and the simulator as the tests run them: started from an engine row's own command
line (the argv the supervisor would run), with a static LoRA adapter and runtime LoRA updating on."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from core.processes import free_port, stop_group
from inference_ops import supervisor, vllm_engine
from inference_ops.models import EngineProcess, LoraAdapter, ModelEndpoint

BASE = vllm_engine.BUNDLED_MODEL  # the served name of the converted Gemma 3 270M
STATIC_ADAPTER = "static-adapter"
MAX_MODEL_LEN = 512
MAKE_LORA = Path(__file__).resolve().parent / "make_lora.py"
COUNTING = "1, 2, 3, 4,"  # the real model continues " 5, 6, 7, ..." greedily


@dataclass
class Engine:
    kind: str
    url: str  # without /v1
    port: int
    pid: int
    runtime_adapter_path: str
    real: bool  # the real vLLM: answers are the model's, adapters change them

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def _adapters(kind: str, folder: Path) -> tuple[Path, Path]:
    static, runtime = folder / "static", folder / "runtime"
    if kind == "vllm":
        model = vllm_engine.model_path(BASE)
        for seed, out in enumerate((static, runtime)):
            subprocess.run([str(vllm_engine.python_path()), str(MAKE_LORA), str(model), str(out), str(seed)],
                           check=True, timeout=300, capture_output=True)
    return static, runtime


def _row(kind: str, port: int, static: Path) -> EngineProcess:
    endpoint = ModelEndpoint.objects.create(name=f"contract-{kind}", kind="vllm", base_url=f"http://127.0.0.1:{port}/v1",
                                            model=BASE, context_window=MAX_MODEL_LEN)
    if kind == "vllm":
        extra = ["--kv-cache-memory-bytes", str(256 * 1024 * 1024)]
    else:
        extra = ["--time-to-first-token", "5", "--inter-token-latency", "10", "--seed", "3"]
    engine = EngineProcess.objects.create(
        name=f"contract-{kind}", endpoint=endpoint, kind=kind, model=BASE, port=port, max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN, enable_lora=True, max_loras=2, max_lora_rank=8, runtime_lora_updating=True,
        enable_prefix_caching=True, extra_args=extra)
    LoraAdapter.objects.create(engine=engine, name=STATIC_ADAPTER, path=str(static), static=True)
    return engine


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the engine exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the engine was not ready after {timeout:g}s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def start_engine(kind: str, folder: Path, django_db_blocker=None) -> Iterator[Engine]:
    """Start `kind` ("simulator" or "vllm") and stop it on exit. The row only gives the command
    line and the environment; it is rolled back at once."""
    static, runtime = _adapters(kind, folder)
    port = free_port()
    blocker = django_db_blocker.unblock() if django_db_blocker is not None else contextlib.nullcontext()
    with blocker, override_settings(VLLM_EXECUTABLE=vllm_engine.PROJECT_VENV), transaction.atomic():
        row = _row(kind, port, static)
        argv, env = supervisor.command_line(row), supervisor.environment(row)
        transaction.set_rollback(True)
    log = folder / "engine.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, url, log, timeout=600 if kind == "vllm" else 30)
        yield Engine(kind=kind, url=url, port=port, pid=process.pid, runtime_adapter_path=str(runtime),
                     real=kind == "vllm")
    finally:
        stop_group(process, timeout=20)
