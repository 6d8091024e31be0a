"""An engine's processes: launched detached in a session of their own, found by that session,
stopped with everything they started; the engine's log file, and whether its port is free.

No row is written here: the supervisor records what these do.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
from django.conf import settings

from inference_ops import engine_keys
from inference_ops.engine_command import command_line, environment
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineProcess


def log_path(engine: EngineProcess) -> Path:
    return Path(settings.VAR_DIR) / "engines" / f"{engine.name}.log"


def log_tail(engine: EngineProcess, lines: int = 60) -> str:
    try:
        with open(log_path(engine), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            return "\n".join(handle.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def process_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def session_processes(pid: int) -> list[psutil.Process]:
    """Every process of the engine's session: vLLM's EngineCore workers rename themselves and
    may leave the process group, but not the session the launcher gave the engine."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) == pid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def terminate_session(pid: int, timeout: float) -> None:
    processes = session_processes(pid)
    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for process in alive + session_processes(pid):
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def kill_leftovers(pid: int) -> None:
    """What a dead engine's session left. vLLM's API server may die alone (a SIGKILL, the OOM
    killer) while its EngineCore and workers live on, holding the model's memory (a GPU's, on a GPU
    host) that a restart needs. With their API server gone nothing is served that a graceful stop
    would finish, so they are killed at once: a restart waits for none of them."""
    processes = session_processes(pid)
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=5)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
    ) as sock:
        # SO_REUSEADDR: a port in TIME_WAIT from the last run is free; only a listener makes it
        # taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def launch(engine: EngineProcess) -> int:
    argv = command_line(engine)
    # From the project folder: the clean environment has no PYTHONPATH to find the launcher by.
    result = subprocess.run(
        [sys.executable, "-m", "inference_ops.launch", str(log_path(engine)), "--", *argv],
        # The key only here, where the supervisor starts it: the engine refuses whoever reaches
        # its port without it (inference_ops.engine_keys). A benchmark's engine run in its own
        # foreground (benchmarks.engines) is called by the harness directly, without one.
        env={**environment(engine), **engine_keys.key_environment(engine)},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise SupervisorError(f"could not launch {argv[0]}: {result.stderr.strip()}")
    return int(result.stdout.strip())
