"""What an engine row's environment may hold (`inference_ops.policy` says why): the clean
environment an engine starts from, the variables a row may add by exact name, and those no row,
operator setting or host passes to an engine.
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase

from django.conf import settings

from core.key_env import ENV_NAME as _ENV_NAME
from core.key_env import GATEWAY_SECRETS


def _matches(name: str, patterns) -> bool:
    """`patterns`: exact names, or shell-style patterns (`VLLM_*`, `NCCL_*_PLUGIN`)."""
    return any(fnmatchcase(name, p) for p in patterns)


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
