"""The benchmark commands' shared command-line arguments: the value parsers and the option groups
several commands offer, written once so that an option means the same in every command.

Each adder takes a parser or an argument group and keeps today's option names, defaults and help
(the docs cite these commands); what differs from one command to another (a default, the unit a
timeout bounds) is a parameter.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

# --- values ---------------------------------------------------------------------------------------


def levels(text: str) -> list[int]:
    """Comma-separated positive integers: levels of concurrency, of sockets, of processes."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def rates(text: str) -> list[float]:
    """Comma-separated request rates in req/s, inf allowed."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated rates (or inf), got {text!r}"
        ) from None
    if not values or min(values) <= 0 or any(math.isnan(v) for v in values):
        raise argparse.ArgumentTypeError(f"request rates must be above 0, got {text!r}")
    return values


def positive(kind):
    """A number of `kind` above 0."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def header(text: str) -> tuple[str, str]:
    """An HTTP header given as 'Name: value'."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--header wants 'Name: value', got {text!r}")
    return name.strip(), value.strip()


# --- option groups --------------------------------------------------------------------------------


def keep_add(parser) -> None:
    """--keep / --no-keep: a command's own database survives the run unless told otherwise."""
    parser.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the bench database for the next run (default on); --no-keep drops it",
    )


def log_dir_add(parser, *, logs: str = "the simulator's and the gateway's logs") -> None:
    """--log-dir: where the processes a command started leave their logs."""
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help=f"keep {logs} here (default: removed)",
    )


def json_add(parser, *, what: str = "the whole report") -> None:
    parser.add_argument("--json", type=Path, default=None, help=f"write {what} as JSON")


def progress_add(parser, *, bars: str = "bar") -> None:
    parser.add_argument("--no-progress", action="store_true", help=f"no progress {bars} on stderr")


def simulator_latency_add(parser, *, ttft: float, itl: float, kind=float) -> None:
    """--ttft and --itl: the vLLM simulator's time to first token and inter-token latency."""
    parser.add_argument(
        "--ttft",
        type=kind,
        default=ttft,
        help=f"the simulator's time to first token, ms (default {ttft:g})",
    )
    parser.add_argument(
        "--itl",
        type=kind,
        default=itl,
        help=f"the simulator's inter-token latency, ms (default {itl:g})",
    )


def load_limits_add(parser, *, kind=float) -> None:
    """--timeout, --max-duration and --cooldown of a load generator's run (benchmarks.loadgen)."""
    parser.add_argument(
        "--timeout",
        type=kind,
        default=120.0,
        help="per request, whole stream, s (default 120)",
    )
    parser.add_argument(
        "--max-duration",
        type=kind,
        default=300.0,
        help="per level, s: requests still in flight then are cut and counted unfinished "
        "(default 300)",
    )
    parser.add_argument(
        "--cooldown", type=float, default=1.0, help="pause between runs, s (default 1)"
    )


def synthetic_kb_add(parser, *, minimum: int, default: int, capacity: int) -> None:
    """--entries: the size of a synthetic KB (benchmarks.kb_data), up to its capacity."""
    parser.add_argument(
        "--entries",
        type=int,
        default=default,
        help=f"FAQ entries in the synthetic KB ({minimum} to {capacity}; default {default})",
    )
