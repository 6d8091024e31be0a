"""Child processes: a free port for one, and stopping one with everything it started.

Every server the gateway, `make run`, the benchmarks and the tests start leads its own process
group (`start_new_session=True` or `process_group=0`), so a stop signals the group, not the
leader alone: daphne's, the simulator's or a prefork Celery worker's children must not outlive
it, keeping a port and CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping

import psutil

# The variable that tags a process with the pid of the test run that started it
# (tests/support/orphans.py sweeps what a killed run left); a launcher that gives a child a clean
# environment passes it on by name.
TEST_RUN_TAG = "GATEWAY_TEST_RUN"
# The variable that names the process whose death must stop the engines it has started (`make
# run` sets it to its own pid): the engine launcher's watchdog stops the engine when that process
# is gone, whatever killed it (inference_ops.launch).
ENGINE_OWNER = "GATEWAY_ENGINE_OWNER"


def free_port() -> int:
    """A loopback port free right now. Another process may take it before ours binds it; on a
    development or test machine that race is rare, and the start then fails loudly."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_group(process: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """SIGTERM to the process's group, then SIGKILL to whatever of the group is left after
    `timeout`."""
    stop_groups({"": process}, grace=timeout)


def stop_groups(
    processes: Mapping[str, subprocess.Popen],
    *,
    grace: float,
    say: Callable[[str], None] = lambda line: None,
) -> None:
    """SIGTERM the group of each process, wait up to `grace` in all, then SIGKILL what is left of
    every group (even after a clean exit of the leader, a child that ignored SIGTERM may be there).
    """
    for process in processes.values():
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for name, process in processes.items():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in {grace:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so nothing keeps serving (or
    holding the port) after a SIGKILL of the process that started it. For `preexec_fn`."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def session_members(sid: int) -> list[psutil.Process]:
    """Every live process of the session `sid`. A server started with `start_new_session=True`
    leads a session of its own, and its children stay in it even where they leave its process
    group (vLLM's EngineCore renames itself and may)."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def with_their_sessions(
    is_tagged: Callable[[psutil.Process], bool], *, session: int | None = None
) -> list[psutil.Process]:
    """Every live process `is_tagged` picks, and every member of their sessions (and of
    `session`) that are theirs. vLLM's EngineCore and workers overwrite their environment when
    they rename themselves, so a tag alone misses them; their session does not.

    A session is theirs when its leader is one of them or is gone: Linux never hands out a pid
    still naming a session, so the members of a gone leader's session are its own. Never a
    session whose leader has no pid here (0: a leader outside this PID namespace, as a
    container's init is, shared by all it started without a session of their own), nor the
    caller's own: a launcher in flight may be tagged there, and that session is whoever started
    the caller (a CI runner, a shell), not an engine."""
    me, own = os.getpid(), os.getsid(0)
    seen: dict[int, tuple[psutil.Process, int, bool]] = {}
    for process in psutil.process_iter(["pid"]):
        if process.pid == me:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            seen[process.pid] = (process, os.getsid(process.pid), is_tagged(process))
    sessions = {sid for _, sid, tagged in seen.values() if tagged}
    if session:
        sessions.add(session)
    sessions = {
        sid for sid in sessions if sid > 0 and sid != own and (sid not in seen or seen[sid][2])
    }
    return [process for process, sid, tagged in seen.values() if tagged or sid in sessions]


def stop_processes(processes: list[psutil.Process], *, grace: float) -> None:
    """SIGTERM each, wait up to `grace` in all, SIGKILL what is left (0: SIGKILL at once)."""
    alive = processes
    if grace > 0:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def stop_session(sid: int, *, grace: float) -> None:
    """Stop the whole session `sid`: SIGTERM, `grace`, then SIGKILL to every member, those that
    joined it meanwhile included."""
    stop_processes(session_members(sid), grace=grace)
    if leftover := session_members(sid):
        stop_processes(leftover, grace=0)
