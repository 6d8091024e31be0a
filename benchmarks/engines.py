"""An engine started from an engine row's own command line and environment, in the foreground of a
benchmark or a test: the argv the supervisor would run, without a supervisor around it.

The row only gives the argv and the environment; it is written in a transaction that is rolled back
at once, so nothing of it stays in the database. The process gets its own session and is stopped
with everything it started when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from benchmarks.servers import wait_answering
from core.processes import TEST_RUN_TAG, free_port, stop_group
from inference_ops import cpu_engine, vllm_engine
from inference_ops.engine_command import command_line, environment
from inference_ops.engine_processes import session_processes
from inference_ops.models import EngineProcess, LoraAdapter, ModelEndpoint


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]
    model: str  # the served name
    port: int


@dataclass(frozen=True)
class RunningEngine:
    url: str  # without /v1
    port: int
    pid: int
    model: str  # the served name
    log_path: Path


def engine_command(
    *, fields: dict, adapters: dict[str, str] | None = None, name: str = "bench-engine"
) -> EngineCommand:
    """The argv and environment of an EngineProcess row with `fields` (kind, model,
    max_num_seqs, ...) and `adapters` (name: path) as its static LoRA adapters, on a free port.
    Needs the database."""
    port = free_port()
    with override_settings(VLLM_EXECUTABLE=vllm_engine.PROJECT_VENV), transaction.atomic():
        endpoint = ModelEndpoint.objects.create(
            name=name, kind="vllm", base_url=f"http://127.0.0.1:{port}/v1", model="-"
        )
        engine = EngineProcess.objects.create(name=name, endpoint=endpoint, port=port, **fields)
        for adapter, path in (adapters or {}).items():
            LoraAdapter.objects.create(engine=engine, name=adapter, path=path, static=True)
        command = EngineCommand(
            argv=command_line(engine),
            env=environment(engine),
            model=engine.api_name,
            port=port,
        )
        transaction.set_rollback(True)
    return command


@contextlib.contextmanager
def engine_run(
    *, command: EngineCommand, log_path: Path, start_timeout: float = 600.0
) -> Iterator[RunningEngine]:
    """The engine `command` starts, ready when yielded, stopped with its whole session at the end.
    Raises RuntimeError with the log's tail when it exits or does not get ready in time."""
    with open(log_path, "ab") as output:
        process = subprocess.Popen(
            command.argv,
            # The engine's environment is a clean one; a test run's tag (tests/support/orphans.py)
            # goes with it, or a killed run's vLLM would be left running unknown.
            env={**command.env, **{k: v for k, v in os.environ.items() if k == TEST_RUN_TAG}},
            cwd=settings.BASE_DIR,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{command.port}"
        wait_answering(
            process,
            f"{url}/v1/models",
            what="the engine",
            log_path=log_path,
            timeout=start_timeout,
            step=0.5,
        )
        yield RunningEngine(
            url=url, port=command.port, pid=process.pid, model=command.model, log_path=log_path
        )
    finally:
        stop_group(process, timeout=20)
        # What left the group but not the session (the supervisor stops engines the same way).
        for leftover in session_processes(process.pid):
            with contextlib.suppress(psutil.Error):
                leftover.kill()


def bundled_vllm_fields(
    *, max_num_seqs: int = 16, max_model_len: int = 2048, kv_cache_mb: int = 1024, **more
) -> dict:
    """The real vLLM serving the bundled Gemma 3 270M, as `make run`'s demo row has it; `more` adds
    or replaces row fields."""
    return {
        "kind": EngineProcess.Kind.VLLM,
        "model": vllm_engine.BUNDLED_MODEL,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "extra_args": ["--kv-cache-memory-bytes", str(kv_cache_mb * 1024 * 1024)],
        "tool_call_parser": "hermes",
        **more,
    }


def bundled_cpu_fields(
    *, max_num_seqs: int | None = None, max_model_len: int | None = None, **more
) -> dict:
    """llama.cpp's llama-server serving the bundled Gemma 3 270M GGUF, as `make run`'s demo row
    has it with LOCAL_ENGINE=cpu; `more` adds or replaces row fields."""
    return {
        "kind": EngineProcess.Kind.CPU,
        "model": cpu_engine.BUNDLED_MODEL,
        "max_num_seqs": max_num_seqs or settings.CPU_ENGINE_PARALLEL,
        "max_model_len": max_model_len or settings.CPU_ENGINE_CTX_PER_SLOT,
        **more,
    }
