"""What a configuration row may ask of the host it runs on.

Endpoint and engine rows are written in the admin, yet they reach the host: an endpoint's
`api_key_env` names a variable whose value leaves as a Bearer token for the row's URL, and an
engine row becomes a command line and an environment on the GPU host. So a row may only name
what is listed here (or added by the operator in settings, who owns the host anyway):

- an endpoint key comes from a variable named with ENDPOINT_KEY_ENV_PREFIX (`GW_KEY_`), or listed
  in ENDPOINT_KEY_ENV_NAMES, or the one EXTERNAL_LLM_API_KEY_ENV names; never a gateway secret;
- an engine starts from a clean environment (a few host variables and what the engines read),
  the row adds only allow-listed variables, never loader, shell or Python hooks;
- `extra_args` are flags allow-listed per engine kind: nothing that loads code (plugins,
  middleware, remote model code), serves or writes files, or rebinds the port;
- no value that lands on the command line may start with `-` and turn into a flag.

The checks run in the models' `clean()` (the admin shows them) and again in the supervisor
before a launch and in `ModelEndpoint.api_key`, for rows written before the rules or by the ORM.
"""

from __future__ import annotations

import os
import re

from django.conf import settings

from core.keys import ENV_NAME as _ENV_NAME
from core.keys import GATEWAY_SECRETS

_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")



def _matches(name: str, patterns) -> bool:
    """`patterns`: exact names, or prefixes written with a trailing `*` (`VLLM_*`)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


# --- engine environments ----------------------------------------------------------------------------------

# Taken from the supervisor's own environment: what any program needs, and what the engines read
# (GPU selection, model caches and tokens, vLLM's and the OpenMP runtime's settings).
ENGINE_ENV_PASSTHROUGH = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "XDG_CACHE_HOME",
    "CUDA_*", "NVIDIA_*", "HF_*", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_*", "VLLM_*", "NCCL_*", "OMP_*",
)
# What a row's `environment` may set: engine tuning, never the host's search paths or hooks.
ENGINE_ENV_ALLOWED = (
    "CUDA_*", "NVIDIA_*", "HF_*", "TRANSFORMERS_*", "TOKENIZERS_PARALLELISM", "VLLM_*", "NCCL_*", "OMP_*",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GGML_*", "LLAMA_*", "TORCH_*", "TORCHINDUCTOR_*",
    "TRITON_*", "PYTORCH_CUDA_ALLOC_CONF",
)
# Refused in a row even where a pattern above (or the operator's list) would allow it: the
# dynamic loader, shells and Python run code from these; HF_ENDPOINT would send the host's
# Hugging Face token elsewhere; vLLM's logging config can instantiate any class.
ENGINE_ENV_REFUSED = (
    "LD_*", "DYLD_*", "PYTHON*", "PATH", "HOME", "SHELL", "BASH_ENV", "ENV", "IFS", "PERL5*", "RUBY*",
    "NODE_OPTIONS", "HF_ENDPOINT", "HF_TOKEN", "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN",
    "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING", *GATEWAY_SECRETS,
)


def environment_problems(environment) -> list[str]:
    if not isinstance(environment, dict):
        return ["must be a JSON object of variable names to values"]
    allowed = (*ENGINE_ENV_ALLOWED, *settings.ENGINE_ENV_ALLOWED)
    problems = []
    for name, value in environment.items():
        if not _ENV_NAME.match(name):
            problems.append(f"{name!r} is not the name of an environment variable")
        elif _matches(name, ENGINE_ENV_REFUSED) or not _matches(name, allowed):
            problems.append(f"{name} is not allowed in an engine's environment (allowed: {', '.join(allowed)})")
        elif not isinstance(value, str | int | float | bool) or "\x00" in str(value):
            problems.append(f"{name}: the value must be a string or a number")
    return problems


def engine_base_environment() -> dict[str, str]:
    """The part of the supervisor's environment an engine gets: never the gateway's secrets."""
    passthrough = (*ENGINE_ENV_PASSTHROUGH, *settings.ENGINE_ENV_PASSTHROUGH)
    return {name: value for name, value in os.environ.items()
            if _matches(name, passthrough) and name not in GATEWAY_SECRETS}


# --- engine arguments ----------------------------------------------------------------------------------------

# vLLM's `serve` flags a row may add: tuning and serving options. Left out on purpose, among
# others: --trust-remote-code (runs the model repository's code), --middleware,
# --tool-parser-plugin, --logits-processors, --worker-cls (import any Python), --load-format
# (pickles), --allowed-local-media-path, --ssl-*, --host/--port/--api-key (the row's own fields).
VLLM_FLAGS = frozenset({
    "--seed", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--quantization", "--dtype",
    "--kv-cache-dtype", "--kv-cache-memory-bytes", "--block-size", "--swap-space", "--cpu-offload-gb", "--enforce-eager",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--max-seq-len-to-capture", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--uvicorn-log-level", "--chat-template", "--chat-template-content-format",
    "--response-role", "--generation-config", "--override-generation-config", "--max-logprobs",
    "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--tokenizer", "--tokenizer-mode",
    "--revision", "--tokenizer-revision", "--download-dir", "--max-loras", "--max-lora-rank", "--max-cpu-loras",
    "--lora-dtype", "--limit-mm-per-prompt", "--max-parallel-loading-workers", "--scheduling-policy",
    "--speculative-config", "--enable-sleep-mode", "--async-scheduling", "--max-num-partial-prefills",
    "--long-prefill-token-threshold", "--disable-custom-all-reduce", "--calculate-kv-scales",
})
# The simulator takes vLLM's flags (and ignores most) plus its own pacing and fault knobs.
SIMULATOR_FLAGS = VLLM_FLAGS | {
    "--time-to-first-token", "--inter-token-latency", "--startup-duration", "--failure-injection-rate",
    "--mode", "--embedding-dim",
}
# llama-server's: sampling, batching, threads, templates. Left out: --path (serves a folder),
# --slot-save-path and --log-file (write files), --model-url/--hf-repo (downloads), --host/--port,
# --api-key*, --ssl-*.
CPU_FLAGS = frozenset({
    "--chat-template", "--chat-template-file", "--jinja", "--no-jinja", "--reverse-prompt", "-r",
    "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n", "--dry-sequence-breaker",
    "--threads", "-t", "--threads-batch", "-tb", "--threads-http", "--seed", "-s", "--temp", "--top-k",
    "--top-p", "--min-p", "--typical", "--repeat-penalty", "--repeat-last-n", "--presence-penalty",
    "--frequency-penalty", "--n-predict", "-n", "--batch-size", "-b", "--ubatch-size", "-ub", "--flash-attn",
    "-fa", "--cache-type-k", "-ctk", "--cache-type-v", "-ctv", "--cont-batching", "--no-cont-batching",
    "--mlock", "--no-mmap", "--keep", "--cache-reuse", "--defrag-thold", "--n-gpu-layers", "-ngl",
    "--no-webui", "--reasoning-format", "--reasoning-budget", "--timeout", "--no-warmup", "--swa-full",
})
FLAGS = {"vllm": VLLM_FLAGS, "simulator": SIMULATOR_FLAGS, "cpu": CPU_FLAGS}


def extra_args_problems(kind: str, extra_args) -> list[str]:
    if not isinstance(extra_args, list):
        return ["must be a JSON list of arguments"]
    allowed = FLAGS.get(kind, frozenset()) | set(settings.ENGINE_EXTRA_ARGS_ALLOWED)
    problems, after_flag = [], False
    for arg in extra_args:
        if not isinstance(arg, str | int | float) or isinstance(arg, bool) or "\x00" in str(arg):
            problems.append(f"{arg!r}: each argument must be a string or a number")
            continue
        text = str(arg)
        if text.startswith("-") and not _NUMBER.match(text):
            flag = text.split("=", 1)[0]
            if flag not in allowed:
                problems.append(f"{flag} is not allowed for a {kind} engine")
            after_flag = True
        elif not after_flag:
            problems.append(f"{text!r} is not allowed: extra arguments start with a flag")
    return problems


# --- rows ---------------------------------------------------------------------------------------------------

NOT_A_FLAG = "must not start with '-' (it would be read as a command-line flag)"


def engine_problems(engine) -> dict[str, list[str]]:
    """Every reason the row may not be launched, by field; empty when it may."""
    problems: dict[str, list[str]] = {}
    for field in ("model", "served_model_name", "bind_host", "quantization", "dtype"):
        if str(getattr(engine, field) or "").startswith("-"):
            problems[field] = [NOT_A_FLAG]
    if found := extra_args_problems(engine.kind, engine.extra_args):
        problems["extra_args"] = found
    if found := environment_problems(engine.environment):
        problems["environment"] = found
    return problems


def adapter_problems(adapter) -> dict[str, list[str]]:
    return {field: [NOT_A_FLAG] for field in ("name", "path", "base_model")
            if str(getattr(adapter, field) or "").startswith("-")}


def problems_text(problems: dict[str, list[str]]) -> str:
    return "; ".join(f"{field}: {message}" for field, messages in problems.items() for message in messages)
