"""CPU time of the server's own processes on this machine, read from /proc around a level.

A process's /proc/PID/stat counts the CPU of all its threads. Its children are found again at
every reading and counted while alive; a child that exits during a level takes its CPU with
it (its parent's cutime only grows when it is reaped, and then with its whole life, not the
level's part), so the report says how many tracked processes exited.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MATCH = r"daphne|celery|devtools\.devserver"
# Engines started by the gateway (make run's local engine, the supervisor's vLLM) are
# descendants of its processes but not its own work: they get their own kind.
KINDS = (
    ("engine", re.compile(r"vllm|inference_ops\.simulator|llama-server|llama_server")),
    ("beat", re.compile(r"celery\b.*\bbeat\b")),
    ("worker", re.compile(r"celery\b.*\bworker\b")),
    ("web", re.compile(r"daphne|uvicorn|gunicorn")),
)
GATEWAY_KINDS = ("web", "worker", "beat", "other")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    starttime: (
        int  # in ticks since boot: with the pid, it names one process even if the pid is reused
    )
    ticks: int  # utime + stime
    cmdline: str


@dataclass(frozen=True)
class CpuProbe:
    """The processes to measure: these roots and all their live descendants."""

    roots: tuple[int, ...]
    note: str = ""

    def snapshot(self) -> dict[tuple[int, int], tuple[str, str, int]]:
        """(pid, starttime) -> (kind, cmdline, CPU ticks) of every tracked process now."""
        table = processes_read()
        tracked: dict[int, str] = {}  # pid -> kind
        stack = [(pid, None) for pid in self.roots if pid in table]
        children: dict[int, list[int]] = {}
        for info in table.values():
            children.setdefault(info.ppid, []).append(info.pid)
        while stack:
            pid, parent_kind = stack.pop()
            if pid in tracked:
                continue
            kind = process_kind(table[pid].cmdline, inherited=parent_kind)
            tracked[pid] = kind
            stack.extend((child, kind) for child in children.get(pid, ()))
        return {
            (pid, table[pid].starttime): (kind, table[pid].cmdline, table[pid].ticks)
            for pid, kind in tracked.items()
        }


def process_kind(cmdline: str, *, inherited: str | None = None) -> str:
    for kind, pattern in KINDS:
        if pattern.search(cmdline):
            return kind
    # A prefork child shows its parent's command line; anything else a web or worker
    # process starts works for it.
    return inherited if inherited and inherited != "engine" else "other"


def cpu_delta(*, before: dict, after: dict, requests: int) -> dict:
    """CPU between two snapshots, in total and per request, by process kind."""
    processes = []
    by_kind: dict[str, float] = {}
    for key, (kind, cmdline, ticks) in after.items():
        # A process absent before started during the level: all of its CPU is the level's.
        used_ms = (ticks - (before[key][2] if key in before else 0)) * 1000 / TICKS
        processes.append({"pid": key[0], "kind": kind, "cmdline": cmdline[:160], "cpu_ms": used_ms})
        by_kind[kind] = by_kind.get(kind, 0.0) + used_ms
    gateway_ms = sum(ms for kind, ms in by_kind.items() if kind in GATEWAY_KINDS)
    per = (lambda ms: ms / requests) if requests else (lambda ms: None)
    return {
        "requests": requests,
        "cpu_ms": by_kind,
        "cpu_ms_per_request": {kind: per(ms) for kind, ms in by_kind.items()},
        # None, not zero, when only engines were tracked: no gateway process was measured.
        "gateway_cpu_ms_per_request": per(gateway_ms)
        if any(k in GATEWAY_KINDS for k in by_kind)
        else None,
        "tick_ms": 1000 / TICKS,  # the resolution of /proc's CPU counters
        "exited": sum(1 for key in before if key not in after),
        "processes": sorted(processes, key=lambda p: -p["cpu_ms"]),
    }


def processes_read() -> dict[int, ProcessInfo]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := process_read(int(name))) is not None:
            table[info.pid] = info
    return table


def process_read(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:  # gone between listing and reading, or not ours to read
        return None
    # The command name in parentheses may hold spaces and parentheses: split after the last one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessInfo(
        pid=pid,
        ppid=int(fields[1]),
        starttime=int(fields[19]),
        ticks=int(fields[11]) + int(fields[12]),
        cmdline=cmdline,
    )


def is_loopback(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_for(
    *, base_url: str, pids: list[int] | None = None, match: str | None = None
) -> CpuProbe | None:
    """The processes to measure for a target, or None when there are none to measure.

    Explicit pids and an explicit pattern are taken as given. Without either, and only for a
    loopback URL, the default pattern is narrowed to the process tree that serves the URL's
    port (so another checkout's `make run` on the same machine is not measured): the topmost
    matching ancestor of the process listening there.
    """
    own = _own_lineage()
    if pids or match:
        table = processes_read()
        roots = set(pids or ())
        if match:
            pattern = re.compile(match)
            roots |= {
                p for p, info in table.items() if p not in own and pattern.search(info.cmdline)
            }
        return CpuProbe(roots=tuple(sorted(roots)), note="") if roots else None
    if not is_loopback(base_url):
        return None
    table = processes_read()
    pattern = re.compile(DEFAULT_MATCH)
    matches = {p for p, info in table.items() if p not in own and pattern.search(info.cmdline)}
    port = urlsplit(base_url).port or (443 if urlsplit(base_url).scheme == "https" else 80)
    inodes = _listening_inodes(port)
    if not inodes:
        return None  # loopback is per network namespace: no listener here, no server here
    family = _descendants(table, matches)
    listener = next((p for p in sorted(family) if _owns_socket(p, inodes)), None)
    if listener is None:
        return None  # the port is served by something else (an engine, another server)
    root = listener
    while table.get(root) and table[root].ppid in matches:
        root = table[root].ppid
    return CpuProbe(roots=(root,), note=f"the process tree of pid {root}, which serves port {port}")


def _own_lineage() -> set[int]:
    # This process and its ancestors: their command lines may hold the pattern (a shell running
    # `bench --cpu-match daphne`), and their CPU is the client's.
    lineage, pid = set(), os.getpid()
    while pid > 1 and pid not in lineage:
        lineage.add(pid)
        info = process_read(pid)
        pid = info.ppid if info else 0
    return lineage


def _descendants(table: dict[int, ProcessInfo], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    seen, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return seen


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN.
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    return inodes


def _owns_socket(pid: int, inodes: set[str]) -> bool:
    targets = {f"socket:[{inode}]" for inode in inodes}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False
