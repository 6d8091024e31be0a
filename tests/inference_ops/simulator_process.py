"""Running the vLLM simulator as a real subprocess, for tests."""

import os
import queue
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from core.processes import stop_group

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"simulator ready on ([\w.\-:]+):(\d+) ")


@dataclass
class RunningSimulator:
    process: subprocess.Popen
    port: int
    output: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_group(self.process)


def launch_simulator(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inference_ops.simulator", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, stopped as a whole
    )


def start_simulator(
    *args: str, env: dict[str, str] | None = None, timeout: float = 15
) -> RunningSimulator:
    """Start the simulator on a free port and wait for its ready line."""
    process = launch_simulator(*args, "--host", "127.0.0.1", "--port", "0", env=env)
    output: list[str] = []
    ready: queue.Queue[int] = queue.Queue()

    def read() -> None:
        # Keep reading for the process's whole life, so a full pipe never blocks its logging.
        for line in process.stdout:
            output.append(line)
            if match := READY.search(line):
                ready.put(int(match.group(2)))

    threading.Thread(target=read, daemon=True).start()
    try:
        port = ready.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        process.wait(timeout=10)
        raise RuntimeError("simulator did not become ready:\n" + "".join(output)) from None
    return RunningSimulator(process=process, port=port, output=output)
