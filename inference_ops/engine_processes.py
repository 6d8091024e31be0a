"""An engine's processes: launched detached in a session of their own, found by that session,
stopped with everything they started; the engine's log file, and whether its port is free.

Every engine carries a tag in its environment, ENGINE_TAG: this database's id and the row's,
inherited by all it starts (vLLM's EngineCore and workers). By it the supervisor tells its own
engines from anything else on the machine: a pid on the row that now names another process is
not ours to stop, the leftovers of an engine whose owner died are found at the next start, and a
port held by a process without the tag is someone else's.

No row is written here: the supervisor records what these do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
from django.conf import settings
from django.db import connection

from core.processes import (
    ENGINE_OWNER,
    TEST_RUN_TAG,
    session_members,
    stop_processes,
    stop_session,
    with_their_sessions,
)
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
    return session_members(pid)


def terminate_session(pid: int, timeout: float) -> None:
    stop_session(pid, grace=timeout)


def kill_leftovers(engine: EngineProcess, pid: int | None) -> None:
    """What a dead engine left (`pid`: its recorded process). vLLM's API server may die alone (a
    SIGKILL, the OOM killer) while its EngineCore and workers live on, holding the model's memory
    (a GPU's, on a GPU host) that a restart needs. With their API server gone nothing is served
    that a graceful stop would finish, so they are killed at once: a restart waits for none."""
    stop_processes(leftovers(engine, pid), grace=0)


# --- whose is it ----------------------------------------------------------------------------------

ENGINE_TAG = "GATEWAY_ENGINE"


def tag(engine: EngineProcess) -> str:
    """This engine's tag: the row's id in this database (its server and name: two checkouts or two
    test runs on one machine have rows with the same ids, and never touch each other's engines)."""
    db = connection.settings_dict
    where = f"{db.get('HOST')}:{db.get('PORT')}/{db.get('NAME')}"
    return f"{hashlib.sha256(where.encode()).hexdigest()[:16]}/{engine.pk}"


def _environ(process: psutil.Process) -> dict[str, str]:
    with contextlib.suppress(psutil.Error, OSError):
        return process.environ()
    return {}  # gone, or another user's: not ours either way


def is_ours(engine: EngineProcess, pid: int | None) -> bool:
    """The process `pid` is alive and is (part of) this engine as we started it."""
    if not process_alive(pid):
        return False
    with contextlib.suppress(psutil.Error):
        return _environ(psutil.Process(pid)).get(ENGINE_TAG) == tag(engine)
    return False


def owner_gone(pid: int | None) -> bool:
    """The engine was started for an owner (`make run`) that is no longer running."""
    with contextlib.suppress(psutil.Error, ValueError):
        owner = _environ(psutil.Process(pid or 0)).get(ENGINE_OWNER)
        return bool(owner) and not psutil.pid_exists(int(owner))  # type: ignore[arg-type]  # `bool(owner) and` leaves a str
    return False


def leftovers(engine: EngineProcess, pid: int | None = None) -> list[psutil.Process]:
    """Every live process of this engine: those carrying its tag, and the members of their
    sessions and of the session of `pid` (a pid the supervisor launched), where a session is
    theirs (core.processes.with_their_sessions: never the caller's, nor one whose leader is a
    stranger on a reused pid)."""
    wanted = tag(engine)
    return with_their_sessions(
        lambda process: _environ(process).get(ENGINE_TAG) == wanted, session=pid
    )


def stop_leftovers(engine: EngineProcess, processes: list[psutil.Process]) -> list[str]:
    """Stop these processes of the engine (SIGTERM, the engine's stop timeout, SIGKILL); what
    they were, for the record."""
    described = [describe(process.pid) for process in processes]
    stop_processes(processes, grace=engine.stop_timeout)
    return described


def describe(pid: int | None) -> str:
    """`pid 1234 (its command line)`, as far as this user may see it."""
    if not pid:
        return "a process this user cannot see"
    with contextlib.suppress(psutil.Error):
        command = " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
        return f"pid {pid} ({command[:160]})"
    return f"pid {pid}"


def port_holder(port: int) -> int | None:
    """The pid listening on `port`, when this user may know it."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    return None


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
    env = {**environment(engine), ENGINE_TAG: tag(engine)}
    # A test run's tag travels by name (tests/support/orphans.py sweeps what a killed run left);
    # the owner's makes the launcher watch it (`make run` sets it: docs/operations.md).
    for name in (TEST_RUN_TAG, ENGINE_OWNER):
        if os.environ.get(name):
            env[name] = os.environ[name]
    owner = ["--owner", env[ENGINE_OWNER]] if env.get(ENGINE_OWNER) else []
    grace = ["--grace", str(engine.stop_timeout)]
    # From the project folder: the clean environment has no PYTHONPATH to find the launcher by.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "inference_ops.launch",
            *owner,
            *grace,
            str(log_path(engine)),
            "--",
            *argv,
        ],
        # The key only here, where the supervisor starts it: the engine refuses whoever reaches
        # its port without it (inference_ops.engine_keys). A benchmark's engine run in its own
        # foreground (benchmarks.engines) is called by the harness directly, without one.
        env={**env, **engine_keys.key_environment(engine)},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
        # Tagged, so never in the caller's session (a CI runner's, a shell's): a sweep while it
        # runs would take that session for the engine's.
        start_new_session=True,
    )
    if result.returncode != 0:
        raise SupervisorError(f"could not launch {argv[0]}: {result.stderr.strip()}")
    return int(result.stdout.strip())
