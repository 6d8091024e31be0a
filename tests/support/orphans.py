"""What a killed test run leaves running. A SIGKILL (a CI timeout, a Ctrl-C twice) gives no
fixture its teardown: the real vLLM, Celery workers, daphne servers and simulators it started go
on, in sessions of their own, and a stray vLLM takes a core for as long as the machine runs,
spoiling every figure measured beside it.

Each run tags the processes it starts: OWNER, the run's pid, travels in their environment (the
engines get a clean one, so `benchmarks.engines.engine_run` and the supervisor's launch pass the
tag on by name). The next run sweeps every tagged process whose run is gone, with all that
process started, before it starts anything itself. A run still going, another checkout's among them,
is left alone; so are the embedded PostgreSQL and Redis, which outlive runs on purpose
(devtools.embedded)."""

import contextlib
import os

import psutil

from core.processes import TEST_RUN_TAG as OWNER

SHARED = frozenset({"postgres", "redis-server"})  # the embedded servers, shared between runs


def tag_this_run() -> None:
    """Every process started from here on carries this run's pid."""
    os.environ[OWNER] = str(os.getpid())


def _owner(process: psutil.Process) -> int | None:
    with contextlib.suppress(psutil.Error, ValueError):
        value = process.environ().get(OWNER)
        return int(value) if value else None
    return None


def left_behind() -> list[psutil.Process]:
    """The tagged processes of runs that are gone, and every process they started."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["name"]):
        owner = _owner(process)
        if owner is None or owner == os.getpid() or psutil.pid_exists(owner):
            continue
        if process.info["name"] in SHARED:
            continue
        found[process.pid] = process
        with contextlib.suppress(psutil.Error):
            for child in process.children(recursive=True):
                found[child.pid] = child
    return list(found.values())


def sweep() -> list[str]:
    """Kill what `left_behind` finds; the command lines of what was killed."""
    processes = left_behind()
    killed = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            killed.append(" ".join(process.cmdline())[:120] or process.name())
            process.kill()
    psutil.wait_procs(processes, timeout=10)
    return killed
