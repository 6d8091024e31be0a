"""The production web command: WEB_CONCURRENCY daphne processes sharing one listening socket.

    HOST=0.0.0.0 PORT=8000 python -m config.web [daphne options, e.g. --proxy-headers]

One daphne process runs one event loop, and its Python work (Django views, embeddings, JSON)
uses one core at a time. This launcher binds HOST:PORT once and hands the socket to each daphne
(`daphne --fd`): the kernel queues new connections on that one socket and whichever process
is free accepts the next one. No port per process, no balancer in front, and a process that is
still warming up (config.warmup runs before daphne listens) simply accepts nothing yet.

`make run` (devtools/devserver.py) runs this same command as its `web` process.
"""

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys

from django.core.exceptions import ImproperlyConfigured

from config.drain import drain_seconds
from core.env import env_bool, env_int, env_str
from core.processes import die_with_parent, stop_groups

# Twisted listens with a backlog of 50 when it binds a port itself; a burst of connections (a
# load balancer filling its pool, every browser reconnecting after a deploy) overflows that while
# the processes are busy, and the overflow waits for SYN retransmits. The kernel caps the value
# at net.core.somaxconn.
BACKLOG = 2048
# A child that has not exited this long after its drain (WEB_DRAIN_SECONDS, config.drain) is
# killed: the drain ends the streams still running, and this is for the rest of its exit. The
# supervisor's grace before its own SIGKILL should be longer than both, so the launcher, not the
# supervisor, is the one that reports a child that hangs.
STOP_GRACE = 8.0
# The socket is the launcher's to choose; daphne would bind these itself, once per process.
_BINDING_OPTIONS = (
    "-b",
    "--bind",
    "-p",
    "--port",
    "-u",
    "--unix-socket",
    "--fd",
    "-e",
    "--endpoint",
)


def log(message: str) -> None:
    print(f"web: {message}", file=sys.stderr, flush=True)


def listen(host: str, port: int) -> socket.socket:
    # IPv4 only: daphne adopts an inherited descriptor as an IPv4 socket (its `fd:` endpoint
    # has no way to say otherwise), so an IPv6 socket would be served with garbled addresses.
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        raise ImproperlyConfigured(
            f"Environment variable HOST must be an IPv4 address or a name with one; got {host!r}."
        ) from None
    sock = socket.socket(family, kind, proto)
    # A restart must not wait for the previous run's connections in TIME_WAIT to expire.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(BACKLOG)
    return sock


def daphne_command(fd: int, *, access_log: bool, options: list[str]) -> list[str]:
    # Daphne writes its access log (one line per request) at its default verbosity; -v 0 turns
    # it off. The application's own logging is Django's LOGGING either way.
    verbosity = ["--access-log", "-"] if access_log else ["-v", "0"]
    return [
        sys.executable,
        "-m",
        "daphne",
        "--fd",
        str(fd),
        *verbosity,
        *options,
        "config.asgi:application",
    ]


def main(argv: list[str]) -> int:
    try:
        host = env_str("HOST", "127.0.0.1")
        port = env_int("PORT", 8000, minimum=1, maximum=65535)
        count = env_int("WEB_CONCURRENCY", os.cpu_count() or 1, minimum=1)
        access_log = env_bool("WEB_ACCESS_LOG", False)
        drain = drain_seconds()
        if any(arg.split("=", 1)[0] in _BINDING_OPTIONS for arg in argv):
            raise ImproperlyConfigured(
                "HOST and PORT choose the socket; do not pass daphne's binding options."
            )
        listener = listen(host, port)
    except ImproperlyConfigured as exc:
        print(f"Configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        log(f"cannot listen on {host}:{port}: {exc}")
        return 1

    stop_signal: list[int] = []

    def on_signal(signum, frame):
        if signum != signal.SIGCHLD:
            stop_signal.append(signum)

    # Every signal also writes a byte to this pipe, so the wait below wakes for a stop request
    # and for a child's exit alike, with no polling and no race with a signal arriving just
    # before it.
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, on_signal)

    children: dict[str, subprocess.Popen] = {}
    exit_code = 1  # unless the loop below ends on a stop request
    try:
        command = daphne_command(listener.fileno(), access_log=access_log, options=argv)
        for _ in range(count):
            if stop_signal:
                break
            # Each child leads its own process group, so a Ctrl-C in a terminal reaches only this
            # launcher, which forwards one SIGTERM: Twisted logs an error for a second stop request.
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                pass_fds=(listener.fileno(),),
                process_group=0,
                preexec_fn=die_with_parent,
            )
            children[f"daphne {process.pid}"] = process
        # The children hold the socket now. Not keeping it here means that once they are gone,
        # clients are refused at once instead of waiting in a backlog nobody accepts from.
        listener.close()
        pids = ", ".join(str(process.pid) for process in children.values())
        log(f"{len(children)} daphne process(es) on http://{host}:{port}: pids {pids}")
        exit_code = _watch(children, wake_read, stop_signal)
    finally:
        if stop_signal:
            log(
                f"{signal.Signals(stop_signal[0]).name}: "
                f"stopping {len(children)} daphne process(es); "
                f"their streams have {drain:g} s to finish"
            )
        stop_groups(children, grace=drain + STOP_GRACE, say=log)
        log("stopped")
    return exit_code


def _watch(children: dict[str, subprocess.Popen], wake_read: int, stop_signal: list[int]) -> int:
    """Until a stop request (0) or a child's exit (1).

    A dead child stops the launcher, with an error, instead of being restarted here: the
    supervisor above (systemd, Kubernetes, make run) already restarts with backoff and shows
    it, while restarts in here would hide a crash loop (a bad setting kills every child at
    import) and leave the port served by fewer processes than configured without anyone seeing.
    """
    while not stop_signal:
        dead = [(name, process) for name, process in children.items() if process.poll() is not None]
        if dead:
            for name, process in dead:
                log(f"{name} exited with code {process.returncode}; stopping the others")
            return 1
        select.select([wake_read], [], [])
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_read, 512):
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
