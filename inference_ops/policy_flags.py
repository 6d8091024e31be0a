"""What an engine row's `extra_args` may pass (`inference_ops.policy` says why): the flags
allow-listed per engine kind (`FLAGS`), and those whose value names a file or folder on the host
(`PATH_FLAGS`), which must lie inside ENGINE_FILES_DIR or the bundled templates.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from django.conf import settings

from inference_ops.cpu_engine import QA_TEMPLATE

_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")

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
