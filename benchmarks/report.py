"""What a benchmark report looks like: tables for a terminal, JSON for machines, a PNG for
people."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .metrics import LATENCIES, PERCENTILES


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"


def level_table(run: dict) -> str:
    """One run (a target at a level in a round), laid out like `vllm bench serve`'s result."""
    m = run["metrics"]
    title = (
        f" {run['target']} {run['label']} round {run['round']}: {run['base_url']} ({run['model']}) "
    )
    width = max(64, len(title) + 8)
    lines = [title.center(width, "=")]

    def row(name: str, value) -> None:
        lines.append(f"{name + ':':<40}{value}")

    row("Completed / failed / unfinished", f"{m['completed']} / {m['failed']} / {m['unfinished']}")
    if m["failed"]:
        row("Failed by error", _counts(m["errors"]))
    row("Duration (s)", _num(m["duration"], 2))
    tokens = f"{m['total_output_tokens']} out, {m['total_input_tokens']} in"
    if m["tokens_counted_from_chunks"]:
        tokens += (
            f" ({m['tokens_counted_from_chunks']} requests had no usage chunk: "
            "counted content chunks)"
        )
    row("Tokens", tokens)
    row("Request throughput (req/s)", _num(m["request_throughput"], 2))
    row("Output token throughput (tok/s)", _num(m["output_throughput"], 1))
    row("Total token throughput (tok/s)", _num(m["total_token_throughput"], 1))
    if m["routes"]:
        row("Roads (X-Route)", _counts(m["routes"]))
    if m["route_targets"]:
        row("Targets (X-Route-Target)", _counts(m["route_targets"]))
    lines.append(" latency (ms) ".center(width, "-"))
    header = f"{'':<14}{'mean':>10}{'median':>10}" + "".join(
        f"{'p' + str(p):>10}" for p in PERCENTILES if p != 50
    )
    lines.append(header)
    for key, name in LATENCIES.items():
        values = [m[f"mean_{key}_ms"], m[f"median_{key}_ms"]] + [
            m[f"p{p}_{key}_ms"] for p in PERCENTILES if p != 50
        ]
        lines.append(f"{name:<14}" + "".join(f"{_num(v, 2):>10}" for v in values))
    cpu = run.get("cpu")
    if cpu:
        lines.append(" CPU on this machine (ms per request) ".center(width, "-"))
        per = cpu["cpu_ms_per_request"]
        lines.append(
            ", ".join(f"{kind} {_num(v, 2)}" for kind, v in sorted(per.items())) or "no process"
        )
        lines.append(
            "gateway processes in all: "
            f"{_num(cpu['gateway_cpu_ms_per_request'], 2)} ms per request, "
            f"over {cpu['requests']} requests (counters tick every {cpu['tick_ms']:g} ms); "
            f"{cpu['exited']} tracked processes exited during the level (their CPU is lost)"
        )
        if cpu.get("note"):
            lines.append(f"measured: {cpu['note']}")
    lines.append("=" * width)
    return "\n".join(lines)


def summary_table(report: dict) -> str:
    """One line per target and level; with several rounds, counts summed and figures the median."""
    columns = [
        ("target", 6),
        ("level", 14),
        ("ok", 6),
        ("fail", 5),
        ("req/s", 8),
        ("out tok/s", 10),
        ("TTFT p50", 9),
        ("TTFT p99", 9),
        ("TPOT p50", 9),
        ("TPOT p99", 9),
        ("ITL p50", 8),
        ("ITL p99", 8),
        ("E2E p50", 9),
        ("E2E p99", 9),
        ("CPU ms/req", 11),
    ]
    header = " ".join(
        f"{name:>{w}}" if i > 1 else f"{name:<{w}}" for i, (name, w) in enumerate(columns)
    )
    lines = [
        "Summary (ms; medians over rounds)"
        if report["benchmark"]["rounds"] > 1
        else "Summary (ms)",
        header,
        "-" * len(header),
    ]
    for row in report["summary"]:
        values = [
            row["target"],
            row["label"],
            str(row["completed"]),
            str(row["failed"]),
            _num(row["request_throughput"], 2),
            _num(row["output_throughput"], 1),
            _num(row["median_ttft_ms"]),
            _num(row["p99_ttft_ms"]),
            _num(row["median_tpot_ms"], 2),
            _num(row["p99_tpot_ms"], 2),
            _num(row["median_itl_ms"], 2),
            _num(row["p99_itl_ms"], 2),
            _num(row["median_e2el_ms"]),
            _num(row["p99_e2el_ms"]),
            _num(row["gateway_cpu_ms_per_request"], 2),
        ]
        lines.append(
            " ".join(
                f"{v:>{w}}" if i > 1 else f"{v:<{w}}"
                for i, (v, (_, w)) in enumerate(zip(values, columns))
            )
        )
    failures = [row for row in report["summary"] if row["failed"]]
    for row in failures:
        lines.append(f"{row['target']} {row['label']} failed: {_counts(row['errors'])}")
    return "\n".join(lines)


def compare_table(report: dict) -> str:
    a, b = (t["name"] for t in report["targets"])
    by = {(row["target"], row["label"]): row for row in report["summary"]}
    header = (
        f"{'level':<14} {'rounds':>6} {a + ' TTFT p50':>12} {b + ' TTFT p50':>12} "
        f"{'added p50':>10} {'added p99':>10} {'out tok/s ' + a + '/' + b:>16}"
    )
    lines = [
        (
            f"{a} = {report['targets'][0]['base_url']}  vs  "
            f"{b} = {report['targets'][1]['base_url']}: "
            f"the TTFT {a} adds over {b} and {a}'s output throughput over {b}'s "
            "(medians over rounds, ms)"
        ),
        header,
        "-" * len(header),
    ]
    for row in report["compare"]:
        ra, rb = by.get((a, row["label"]), {}), by.get((b, row["label"]), {})
        lines.append(
            f"{row['label']:<14} {row['rounds']:>6} {_num(ra.get('median_ttft_ms')):>12} "
            f"{_num(rb.get('median_ttft_ms')):>12} {_num(row['added_ttft_p50_ms']):>10} "
            f"{_num(row['added_ttft_p99_ms']):>10} {_num(row['output_throughput_ratio'], 3):>16}"
        )
    return "\n".join(lines)


def _clean(value):
    # JSON has no NaN: an empty statistic (no completed request) is written as null.
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def json_write(*, report: dict, path: Path, save_requests: bool = False) -> None:
    runs = (
        report["runs"]
        if save_requests
        else [{k: v for k, v in run.items() if k != "requests"} for run in report["runs"]]
    )
    path.write_text(json.dumps(_clean({**report, "runs": runs}), indent=2) + "\n", encoding="utf-8")


def plot_write(*, report: dict, path: Path) -> None:
    """TTFT p50 and p99, and output throughput, against the level, one line per target."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the file is the output
    from matplotlib import pyplot

    rate_mode = report["benchmark"]["levels"][0]["concurrency"] is None
    figure, (ttft_axis, throughput_axis) = pyplot.subplots(1, 2, figsize=(12, 4.8))
    for index, target in enumerate(report["targets"]):
        rows = [
            r
            for r in report["summary"]
            if r["target"] == target["name"] and r["x"] is not None and math.isfinite(r["x"])
        ]
        xs = [r["x"] for r in rows]
        color = f"C{index}"
        name = f"{target['name']} {target['base_url']}"
        ttft_axis.plot(
            xs, [_nan(r["median_ttft_ms"]) for r in rows], "o-", color=color, label=f"{name} p50"
        )
        ttft_axis.plot(
            xs, [_nan(r["p99_ttft_ms"]) for r in rows], "s--", color=color, label=f"{name} p99"
        )
        throughput_axis.plot(
            xs, [_nan(r["output_throughput"]) for r in rows], "o-", color=color, label=name
        )
    for axis, label in ((ttft_axis, "TTFT (ms)"), (throughput_axis, "output throughput (tok/s)")):
        axis.set_xlabel("request rate (req/s)" if rate_mode else "concurrency (requests in flight)")
        axis.set_ylabel(label)
        xs = sorted(
            {r["x"] for r in report["summary"] if r["x"] is not None and math.isfinite(r["x"])}
        )
        if len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 8:
            axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [f"{x:g}" for x in xs])
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    ttft_axis.set_ylim(bottom=0)
    throughput_axis.set_ylim(bottom=0)
    ttft_axis.set_title("time to first token")
    throughput_axis.set_title("output token throughput")
    rounds = report["benchmark"]["rounds"]
    figure.suptitle(
        f"{report['benchmark']['dataset']} prompts, max_tokens {report['benchmark']['max_tokens']}"
        + (f", medians over {rounds} rounds" if rounds > 1 else "")
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def _nan(value):
    return math.nan if value is None else value
