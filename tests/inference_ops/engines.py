"""The real vLLM and the simulator as the tests run them: started from an engine row's own command
line (the argv the supervisor would run, benchmarks.engines), with a static LoRA adapter and runtime
LoRA updating on."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.engines import bundled_vllm_fields, engine_command, engine_run
from inference_ops import vllm_engine

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
            subprocess.run(
                [str(vllm_engine.python_path()), str(MAKE_LORA), str(model), str(out), str(seed)],
                check=True,
                timeout=300,
                capture_output=True,
            )
    return static, runtime


def _fields(kind: str) -> dict:
    common = dict(
        max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        runtime_lora_updating=True,
        enable_prefix_caching=True,
        tool_call_parser="hermes",
    )
    if kind == "vllm":
        return bundled_vllm_fields(kv_cache_mb=256, **common)
    return {
        **common,
        "kind": kind,
        "model": BASE,
        "extra_args": ["--time-to-first-token", "5", "--inter-token-latency", "10", "--seed", "3"],
    }


@contextlib.contextmanager
def start_engine(
    kind: str, folder: Path, django_db_blocker=None, extra_args: tuple[str, ...] = ()
) -> Iterator[Engine]:
    """Start `kind` ("simulator" or "vllm") from an engine row's argv and stop it on exit;
    `extra_args` go after the row's own."""
    static, runtime = _adapters(kind, folder)
    fields = _fields(kind)
    fields["extra_args"] = [*fields["extra_args"], *extra_args]
    with django_db_blocker.unblock() if django_db_blocker is not None else contextlib.nullcontext():
        command = engine_command(
            fields=fields, adapters={STATIC_ADAPTER: str(static)}, name=f"contract-{kind}"
        )
    with engine_run(
        command=command, log_path=folder / "engine.log", start_timeout=600 if kind == "vllm" else 30
    ) as running:
        yield Engine(
            kind=kind,
            url=running.url,
            port=running.port,
            pid=running.pid,
            runtime_adapter_path=str(runtime),
            real=kind == "vllm",
        )
