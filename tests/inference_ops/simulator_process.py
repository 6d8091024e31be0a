"""Running the vLLM simulator as a real subprocess, for tests."""

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

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
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


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


def start_simulator(*args: str, env: dict[str, str] | None = None, timeout: float = 15) -> RunningSimulator:
    """Start the simulator on a free port and wait for its ready line."""
    process = launch_simulator(*args, "--host", "127.0.0.1", "--port", "0", env=env)
    output: list[str] = []
    deadline = time.monotonic() + timeout
    port = None
    while port is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or process.poll() is not None:
            process.kill()
            raise RuntimeError("simulator did not become ready:\n" + "".join(output))
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if readable:
            line = process.stdout.readline()
            output.append(line)
            if match := READY.search(line):
                port = int(match.group(2))
    sim = RunningSimulator(process=process, port=port, output=output)

    def drain() -> None:
        # Keep reading so a full pipe never blocks the simulator's logging.
        for line in process.stdout:
            output.append(line)

    threading.Thread(target=drain, daemon=True).start()
    return sim
