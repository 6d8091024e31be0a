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
- a flag that names a file or folder on the host (a chat template, the download folder, a
  tokenizer or generation config given as a path) names one inside ENGINE_FILES_DIR, or the
  project's bundled templates: the GPU host is another machine than the admin's, and its SSH
  keys or its environment must not become a template in a prompt;
- no value that lands on the command line may start with `-` and turn into a flag.

The checks run in the models' `clean()` (the admin shows them) and again in the supervisor
before a launch and in `ModelEndpoint.api_key`, for rows written before the rules or by the ORM.
"""

from __future__ import annotations

import os
import posixpath
import re
from fnmatch import fnmatchcase
from pathlib import Path

from django.conf import settings

from core.key_env import ENV_NAME as _ENV_NAME
from core.key_env import GATEWAY_SECRETS
from inference_ops.cpu_engine import QA_TEMPLATE

_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")


def _matches(name: str, patterns) -> bool:
    """`patterns`: exact names, or shell-style patterns (`VLLM_*`, `NCCL_*_PLUGIN`)."""
    return any(fnmatchcase(name, p) for p in patterns)


# --- engine environments --------------------------------------------------------------------------

# Taken from the supervisor's own environment: what any program needs, and what the engines read
# (GPU selection, model caches and tokens, vLLM's and the OpenMP runtime's settings).
ENGINE_ENV_PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "CUDA_*",
    "NVIDIA_*",
    "HF_*",
    "HUGGING_FACE_HUB_TOKEN",
    "TRANSFORMERS_*",
    "VLLM_*",
    "NCCL_*",
    "OMP_*",
)
# What a row's `environment` may set, by exact name: tuning the engines and the libraries under
# them actually read. Never a pattern: a family such as CUDA_*, OMP_* or TRITON_* also holds
# variables that load code (CUDA_INJECTION64_PATH, OMP_TOOL_LIBRARIES, TRITON_CACHE_MANAGER), and
# the next release adds more. A name missing here belongs in the operator's ENGINE_ENV_ALLOWED
# (exact names too) or in the worker's own environment (ENGINE_ENV_PASSTHROUGH).
ENGINE_ENV_ALLOWED = frozenset(
    {
        # Which GPUs, in which order (the CUDA runtime and the NVIDIA container runtime).
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_MODULE_LOADING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_TF32_OVERRIDE",
        # Hugging Face: where the weights are cached, and how they are fetched (never from where:
        # HF_ENDPOINT would send the host's token elsewhere).
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "HF_HUB_ETAG_TIMEOUT",
        "TRANSFORMERS_OFFLINE",
        "TRANSFORMERS_VERBOSITY",
        "TOKENIZERS_PARALLELISM",
        # vLLM's tuning (vllm/envs.py). Not VLLM_SERVER_DEV_MODE (unauthenticated debug routes),
        # VLLM_ALLOW_RUNTIME_LORA_UPDATING (the row's own field), VLLM_API_KEY (the supervisor's),
        # VLLM_PLUGINS, VLLM_ALLOW_INSECURE_SERIALIZATION, VLLM_USE_MODELSCOPE, nor a path.
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOG_STATS_INTERVAL",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "VLLM_ENGINE_READY_TIMEOUT_S",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "VLLM_WORKER_MULTIPROC_METHOD",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        "VLLM_DISABLE_COMPILE_CACHE",
        "VLLM_ENFORCE_STRICT_TOOL_CALLING",
        # NCCL's tuning and debugging to the log (not its *_PLUGIN, *_FILE or NCCL_NET).
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_P2P_DISABLE",
        "NCCL_P2P_LEVEL",
        "NCCL_SHM_DISABLE",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_ALGO",
        "NCCL_PROTO",
        # Threads: OpenMP (not OMP_TOOL*, which loads a tool library), Intel's OpenMP, BLAS.
        "OMP_NUM_THREADS",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "OMP_WAIT_POLICY",
        "OMP_DYNAMIC",
        "OMP_SCHEDULE",
        "OMP_STACKSIZE",
        "KMP_AFFINITY",
        "KMP_BLOCKTIME",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        # ggml and llama.cpp's server (not LLAMA_ARG_*: every flag, past the flags' allow-list).
        "GGML_CUDA_ENABLE_UNIFIED_MEMORY",
        "GGML_CUDA_NO_PINNED",
        "GGML_SCHED_MAX_COPIES",
        "GGML_VK_VISIBLE_DEVICES",
        "LLAMA_LOG_VERBOSITY",
        "LLAMA_LOG_COLORS",
        "LLAMA_LOG_PREFIX",
        "LLAMA_LOG_TIMESTAMPS",
        # PyTorch's allocator and compile threads, Triton's autotuning report.
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "TORCHINDUCTOR_COMPILE_THREADS",
        "TRITON_PRINT_AUTOTUNING",
    }
)
# Refused in a row even where the operator's ENGINE_ENV_ALLOWED would allow it: the dynamic
# loader, shells and Python run code from these; HF_ENDPOINT would send the host's Hugging Face
# token elsewhere; vLLM's logging config can instantiate any class.
#
# The libraries under the engines load code or host files from what these name: NCCL opens
# its net, tuner, profiler and env plugins and reads or writes its topology, graph, config and
# debug files; Triton runs ptxas, cuobjdump and nvdisasm and loads libcuda from its *_PATH
# variables and compiled kernels from its cache and override folders, and imports the class its
# cache manager and remote cache backend name, as TorchInductor, torch's extensions and vLLM's
# compile cache load code; the CUDA runtime loads the library CUDA_INJECTION*_PATH names and the
# OpenMP runtime the tools OMP_TOOL_LIBRARIES names; CUDA_HOME/CUDA_PATH choose the toolkit whose
# compilers and libraries run; ggml loads a backend library from GGML_BACKEND_PATH; llama-server
# reads every flag from LLAMA_ARG_* (LLAMA_ARG_PATH serves a folder), past the flags' allow-list.
# vLLM imports its plugins, unpickles with insecure serialization, and in dev mode serves routes
# without its key (/collective_rpc runs a method on every worker); the supervisor sets the keys
# and runtime LoRA updating itself. Such a setting belongs in the worker's own environment
# (ENGINE_ENV_PASSTHROUGH), set by whoever runs the host; the few that no engine of ours may run
# with at all are NEVER_PASSED below.
ENGINE_ENV_REFUSED = (
    "LD_*",
    "DYLD_*",
    "PYTHON*",
    "PATH",
    "HOME",
    "SHELL",
    "BASH_ENV",
    "ENV",
    "IFS",
    "PERL5*",
    "RUBY*",
    "NODE_OPTIONS",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HF_TOKEN_PATH",
    "HF_MODULES_CACHE",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING",
    *GATEWAY_SECRETS,
    "NCCL_*_PLUGIN",
    "NCCL_*_FILE",
    "NCCL_NET",
    "TRITON_*_PATH",
    "TRITON_*_DIR",
    "TRITON_HOME",
    "TRITON_*CACHE_MANAGER",
    "TRITON_REMOTE_CACHE_BACKEND",
    "TORCHINDUCTOR_*_DIR",
    "TORCH_EXTENSIONS_DIR",
    "TORCH_HOME",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_CACHE_PATH",
    "CUDA_INJECTION*",
    "OMP_TOOL*",
    "VLLM_*_PATH",
    "VLLM_*_DIR",
    "VLLM_*_ROOT",
    "VLLM_PLUGINS",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_USE_MODELSCOPE",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_API_KEY",
    "GGML_*_PATH",
    "LLAMA_ARG_*",
    "LLAMA_API_KEY",
)
# Never in an engine's environment, whatever the worker's own holds or the operator passes
# through: vLLM's dev mode serves routes its key does not guard; runtime LoRA updating is the
# row's `runtime_lora_updating`, and the key the supervisor's (inference_ops.engine_keys).
NEVER_PASSED = frozenset(
    {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY", "LLAMA_API_KEY"}
)


def environment_problems(environment) -> list[str]:
    if not isinstance(environment, dict):
        return ["must be a JSON object of variable names to values"]
    allowed = ENGINE_ENV_ALLOWED | set(settings.ENGINE_ENV_ALLOWED)
    problems = []
    for name, value in environment.items():
        if not _ENV_NAME.match(name):
            problems.append(f"{name!r} is not the name of an environment variable")
        elif _matches(name, ENGINE_ENV_REFUSED):
            problems.append(
                f"{name} is not allowed in an engine's environment: it loads code, names host "
                "files, or is set by the gateway itself (set it in the worker's environment and "
                "ENGINE_ENV_PASSTHROUGH if the host needs it)"
            )
        elif name not in allowed:
            problems.append(
                f"{name} is not an engine variable a row may set ({_allowed_like(name, allowed)})"
            )
        elif not isinstance(value, str | int | float | bool) or "\x00" in str(value):
            problems.append(f"{name}: the value must be a string or a number")
    return problems


def _allowed_like(name: str, allowed) -> str:
    """The allowed names of `name`'s family (its first word), to say what is meant instead."""
    family = name.split("_", 1)[0] + "_"
    kin = sorted(n for n in allowed if n.startswith(family))
    listed = f"allowed {family}* names: {', '.join(kin)}; " if kin else ""
    return (
        f"{listed}variables are allowed by exact name (inference_ops/policy.py; the operator "
        "adds names with ENGINE_ENV_ALLOWED)"
    )


def engine_base_environment() -> dict[str, str]:
    """The part of the supervisor's environment an engine gets: never the gateway's secrets, nor
    what no engine of ours may run with (NEVER_PASSED)."""
    passthrough = (*ENGINE_ENV_PASSTHROUGH, *settings.ENGINE_ENV_PASSTHROUGH)
    return {
        name: value
        for name, value in os.environ.items()
        if _matches(name, passthrough) and name not in GATEWAY_SECRETS and name not in NEVER_PASSED
    }


# --- engine arguments -----------------------------------------------------------------------------

# vLLM's `serve` flags a row may add: tuning and serving options. Left out on purpose, among
# others: --trust-remote-code (runs the model repository's code), --middleware,
# --tool-parser-plugin, --logits-processors, --worker-cls (import any Python), --load-format
# (pickles), --allowed-local-media-path, --ssl-*, --host/--port/--api-key (the row's own fields).
VLLM_FLAGS = frozenset(
    {
        "--seed",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--quantization",
        "--dtype",
        "--kv-cache-dtype",
        "--kv-cache-memory-bytes",
        "--block-size",
        "--swap-space",
        "--cpu-offload-gb",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--max-seq-len-to-capture",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-log-requests",
        "--uvicorn-log-level",
        "--chat-template",
        "--chat-template-content-format",
        "--response-role",
        "--generation-config",
        "--override-generation-config",
        "--max-logprobs",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "--reasoning-parser",
        "--tokenizer",
        "--tokenizer-mode",
        "--revision",
        "--tokenizer-revision",
        "--download-dir",
        "--max-loras",
        "--max-lora-rank",
        "--max-cpu-loras",
        "--lora-dtype",
        "--limit-mm-per-prompt",
        "--max-parallel-loading-workers",
        "--scheduling-policy",
        "--speculative-config",
        "--enable-sleep-mode",
        "--async-scheduling",
        "--max-num-partial-prefills",
        "--long-prefill-token-threshold",
        "--disable-custom-all-reduce",
        "--calculate-kv-scales",
        # A pooling model (an endpoint that serves embeddings): `--runner pooling --convert embed`.
        "--runner",
        "--convert",
    }
)
# The simulator takes vLLM's flags (and ignores most) plus its own pacing and fault knobs.
SIMULATOR_FLAGS = VLLM_FLAGS | {
    "--time-to-first-token",
    "--inter-token-latency",
    "--startup-duration",
    "--failure-injection-rate",
    "--mode",
    "--embedding-dim",
}
# llama-server's: sampling, batching, threads, templates. Left out: --path (serves a folder),
# --slot-save-path and --log-file (write files), --model-url/--hf-repo (downloads), --host/--port,
# --api-key*, --ssl-*.
CPU_FLAGS = frozenset(
    {
        "--chat-template",
        "--chat-template-file",
        "--jinja",
        "--no-jinja",
        "--reverse-prompt",
        "-r",
        "--dry-multiplier",
        "--dry-base",
        "--dry-allowed-length",
        "--dry-penalty-last-n",
        "--dry-sequence-breaker",
        "--threads",
        "-t",
        "--threads-batch",
        "-tb",
        "--threads-http",
        "--seed",
        "-s",
        "--temp",
        "--top-k",
        "--top-p",
        "--min-p",
        "--typical",
        "--repeat-penalty",
        "--repeat-last-n",
        "--presence-penalty",
        "--frequency-penalty",
        "--n-predict",
        "-n",
        "--batch-size",
        "-b",
        "--ubatch-size",
        "-ub",
        "--flash-attn",
        "-fa",
        "--cache-type-k",
        "-ctk",
        "--cache-type-v",
        "-ctv",
        "--cont-batching",
        "--no-cont-batching",
        "--mlock",
        "--no-mmap",
        "--keep",
        "--cache-reuse",
        "--defrag-thold",
        "--n-gpu-layers",
        "-ngl",
        "--no-webui",
        "--reasoning-format",
        "--reasoning-budget",
        "--timeout",
        "--no-warmup",
        "--swa-full",
    }
)
FLAGS = {"vllm": VLLM_FLAGS, "simulator": SIMULATOR_FLAGS, "cpu": CPU_FLAGS}


# Flags whose value is read as a file or folder on the host (writes, for --download-dir), by kind.
# vLLM's --chat-template is a path unless it holds Jinja's characters (then it is the template
# itself); llama-server's is a built-in template's name or the template itself, never a path.
# --tokenizer and --generation-config may also name a Hugging Face repository (or vLLM's keywords).
_TEMPLATE, _FOLDER, _MODEL_FILES = "template", "folder", "model files"
_VLLM_PATH_FLAGS = {
    "--chat-template": _TEMPLATE,
    "--download-dir": _FOLDER,
    "--tokenizer": _MODEL_FILES,
    "--generation-config": _MODEL_FILES,
}
PATH_FLAGS = {
    "vllm": _VLLM_PATH_FLAGS,
    "simulator": _VLLM_PATH_FLAGS,
    "cpu": {"--chat-template-file": "file"},
}
_JINJA = re.compile(r"[{}\n]")
_REPOSITORY = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_GENERATION_KEYWORDS = {"auto", "vllm"}
# The project's own templates, which the demo's and the benchmarks' rows name.
BUNDLED_TEMPLATES = QA_TEMPLATE.parent


def _inside(path: str, folder) -> bool:
    return Path(path).is_relative_to(posixpath.normpath(str(folder)))


def _path_problem(flag: str, use: str, value: str) -> str | None:
    """Why `value` may not follow `flag`, or None. Paths are judged as written (the host that
    runs the engine may be another machine than the one checking): absolute, without `..`."""
    # vLLM opens the value first and takes it as the template only if that fails.
    if use == _TEMPLATE and _JINJA.search(value) and not value.startswith(("/", ".", "~")):
        return None
    if flag == "--generation-config" and value in _GENERATION_KEYWORDS:
        return None
    if use == _MODEL_FILES and ".." not in value and _REPOSITORY.match(value):
        return None
    files = settings.ENGINE_FILES_DIR
    readable = [files] if use == _FOLDER else [files, BUNDLED_TEMPLATES]
    own_template = settings.CPU_ENGINE_CHAT_TEMPLATE  # the operator's, set on the host itself
    if (
        use != _FOLDER
        and own_template not in ("", "qa")
        and value == str(Path(own_template).expanduser())
    ):
        return None
    if (
        value.startswith("/")
        and ".." not in value.split("/")
        and any(_inside(value, folder) for folder in readable)
    ):
        return None
    where = files if use == _FOLDER else f"{files} (or the project's bundled templates)"
    return f"{flag} {value!r} is not allowed: a path given here must be absolute and inside {where}"


def extra_args_problems(kind: str, extra_args) -> list[str]:
    if not isinstance(extra_args, list):
        return ["must be a JSON list of arguments"]
    allowed = FLAGS.get(kind, frozenset()) | set(settings.ENGINE_EXTRA_ARGS_ALLOWED)
    path_flags = PATH_FLAGS.get(kind, {})
    problems, after_flag, pending = [], False, None  # pending: a path flag waiting for its value
    for arg in extra_args:
        if not isinstance(arg, str | int | float) or isinstance(arg, bool) or "\x00" in str(arg):
            problems.append(f"{arg!r}: each argument must be a string or a number")
            continue
        text = str(arg)
        if text.startswith("-") and not _NUMBER.match(text):
            flag, equals, value = text.partition("=")
            if flag not in allowed:
                problems.append(f"{flag} is not allowed for a {kind} engine")
            after_flag, pending = True, None
            if flag in path_flags:
                if equals:
                    problems += filter(None, [_path_problem(flag, path_flags[flag], value)])
                else:
                    pending = flag
        elif not after_flag:
            problems.append(f"{text!r} is not allowed: extra arguments start with a flag")
        elif pending is not None:
            problems += filter(None, [_path_problem(pending, path_flags[pending], text)])
            pending = None
    return problems


# --- rows -----------------------------------------------------------------------------------------

NOT_A_FLAG = "must not start with '-' (it would be read as a command-line flag)"


def engine_problems(engine) -> dict[str, list[str]]:
    """Every reason the row may not be launched, by field; empty when it may."""
    problems: dict[str, list[str]] = {}
    for field in ("model", "served_model_name", "bind_host", "quantization", "dtype"):
        if str(getattr(engine, field) or "").startswith("-"):
            problems[field] = [NOT_A_FLAG]
    parser = getattr(engine, "tool_call_parser", "")
    if parser and not re.fullmatch(r"[a-z0-9_]{1,50}", parser):
        # A name of vLLM's own parsers; a plugin's module path would load code on the host.
        problems["tool_call_parser"] = ["a parser's name: lowercase letters, digits and _"]
    elif parser and engine.kind == "cpu":
        problems["tool_call_parser"] = [
            "llama.cpp's server reads tool calls through its chat template (--jinja); "
            "it has no parser to set"
        ]
    if found := extra_args_problems(engine.kind, engine.extra_args):
        problems["extra_args"] = found
    if found := environment_problems(engine.environment):
        problems["environment"] = found
    return problems


def adapter_problems(adapter) -> dict[str, list[str]]:
    return {
        field: [NOT_A_FLAG]
        for field in ("name", "path", "base_model")
        if str(getattr(adapter, field) or "").startswith("-")
    }


def problems_text(problems: dict[str, list[str]]) -> str:
    return "; ".join(
        f"{field}: {message}" for field, messages in problems.items() for message in messages
    )
