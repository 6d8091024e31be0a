"""Start an engine detached from the caller:
`python -m inference_ops.launch [--owner PID --grace SECONDS] LOG -- ARGV...`.

The engine runs in its own session (so its whole tree can be signalled by
session id) and is not a child of the Celery worker that asked for it: a
worker restart neither kills the engine nor leaves it a zombie. Prints the
engine's pid and exits.

With `--owner`, a watchdog stays behind for the engine's life: when the owner process is gone,
however it went (a SIGKILL runs no handler, a closed terminal, the OOM killer), the watchdog stops
the engine's whole session (SIGTERM, `--grace` seconds, SIGKILL) and exits; it exits with the
engine's session too (its last process, not its first). PR_SET_PDEATHSIG cannot do this: the
engine's parent is this launcher, which exits at once, and vLLM's EngineCore children are not
the engine's first process. The watchdog leads a session of its own, so a Ctrl-C or a hang-up
meant for the owner's terminal does not reach it.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import psutil

from core.processes import session_members, stop_session

WATCH_STEP = 0.2  # seconds between looks at the owner and the engine


def _parse(argv: list[str]) -> tuple[int | None, float, str, list[str]] | None:
    owner, grace = None, 10.0
    try:
        while argv and argv[0] in ("--owner", "--grace"):
            flag, value, argv = argv[0], argv[1], argv[2:]
            if flag == "--owner":
                owner = int(value)
            else:
                grace = float(value)
    except (IndexError, ValueError):
        return None
    if len(argv) < 3 or argv[1] != "--":
        return None
    return owner, grace, argv[0], argv[2:]


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print(
            "usage: python -m inference_ops.launch [--owner PID --grace S] LOG -- ARGV...",
            file=sys.stderr,
        )
        return 2
    owner_pid, grace, log_path, command = parsed
    owner = None
    if owner_pid is not None:
        try:
            # Held from before the engine starts: psutil compares start times, so a pid reused
            # after the owner's death never passes for it.
            owner = psutil.Process(owner_pid)
        except psutil.Error:
            print(f"error: the owner process {owner_pid} is gone", file=sys.stderr)
            return 1
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "ab", buffering=0) as log:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        log.write(f"\n=== {stamp} starting: {' '.join(command)}\n".encode())
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"=== could not start: {exc}\n".encode())
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(process.pid, flush=True)
    if owner is not None and os.fork() == 0:
        _watchdog(owner, process.pid, grace, log_path)  # never returns
    return 0


def _watchdog(owner: psutil.Process, engine_pid: int, grace: float, log_path: str) -> None:
    """The forked child: away from the caller's session and pipes (the caller reads our stdout
    to its end), then watch until the engine or its owner is gone."""
    code = 0
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        while True:
            # Until the whole session is gone: a leader that exits on SIGTERM may leave a child
            # that ignores it (vLLM's EngineCore), and a stop that began may never finish.
            if not _alive(engine_pid) and not session_members(engine_pid):
                break
            if _gone(owner):
                with open(log_path, "ab", buffering=0) as log:
                    log.write(
                        f"=== the owner process {owner.pid} is gone: stopping the engine "
                        f"(pid {engine_pid}) and its session\n".encode()
                    )
                stop_session(engine_pid, grace=grace)
                break
            time.sleep(WATCH_STEP)
    except BaseException:  # noqa: BLE001 - a forked child must never go back into main()
        code = 1
    finally:
        os._exit(code)


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
