"""A killed test run's processes are swept by the next run (tests/support/orphans.py): the tagged
process of a run that is gone dies with what it started; a live run's stay."""

import os
import subprocess
import sys
import time

import psutil

from tests.support import orphans

# A process that starts a child of its own in a session of its own and with a clean environment
# (as a worker's supervisor starts an engine: untagged), prints that child's pid, then waits.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True, env={})
print(child.pid, flush=True)
time.sleep(120)
"""


def _run_owned_by(owner: int) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        env={**os.environ, orphans.OWNER: str(owner)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return parent, int(parent.stdout.readline())


def _gone_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_what_a_gone_run_started_is_killed_with_its_children_and_a_live_runs_stays():
    dead = _gone_pid()
    assert not psutil.pid_exists(dead)
    left, left_child = _run_owned_by(dead)
    ours, our_child = _run_owned_by(os.getpid())
    try:
        killed = orphans.sweep()
        deadline = time.monotonic() + 10
        while _alive(left_child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left.wait(10) is not None and not _alive(left_child)
        assert len(killed) == 2 and any("time.sleep(120)" in command for command in killed)
        assert ours.poll() is None and _alive(our_child)
    finally:
        for process in (left, ours):
            process.kill()
            process.wait()
        for pid in (left_child, our_child):
            if _alive(pid):
                psutil.Process(pid).kill()
