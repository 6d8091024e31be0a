"""The gateway bench's report (benchmarks.gateway): the issue's targets set against it, and its
figures laid out for a terminal and as JSON."""

from __future__ import annotations

import json

from benchmarks.report import _clean
from benchmarks.stats import finite

# --- the targets ------------------------------------------------------------------------


def _level(report: dict, key: str, concurrency: int) -> dict | None:
    return next(
        (row for row in report["sweep"][key]["levels"] if row["concurrency"] == concurrency), None
    )


def targets_evaluate(*, report: dict) -> list[dict]:
    """Each target of the issue: what it asks, the measured value, and met (True/False), or None
    when its part did not run or has no figure."""
    rows: list[dict] = []

    def add(name: str, value, unit: str, ok) -> None:
        rows.append(
            {
                "target": name,
                "value": value if finite(value) else None,
                "unit": unit,
                "met": None if not finite(value) else bool(ok(value)),
            }
        )

    for key, model, p50, p99, ratio in (
        ("named", "local", 30, 100, 0.90),
        ("auto", "auto", 60, None, 0.85),
    ):
        row = _level(report, key, 64) or {}
        add(
            f"{model}: added TTFT p50 <= {p50} ms at c=64",
            row.get("added_ttft_p50_ms"),
            "ms",
            lambda v, p50=p50: v <= p50,
        )
        if p99 is not None:
            add(
                f"{model}: added TTFT p99 <= {p99} ms at c=64",
                row.get("added_ttft_p99_ms"),
                "ms",
                lambda v, p99=p99: v <= p99,
            )
        add(
            f"{model}: throughput >= {ratio:.2f}x direct at c=64",
            row.get("output_throughput_ratio"),
            "x",
            lambda v, ratio=ratio: v >= ratio,
        )
    for key, model in (("named", "local"), ("auto", "auto")):
        row = _level(report, key, 256)
        add(
            f"{model}: no failed request at c=256",
            row["gateway_failed"] if row else None,
            "failed",
            lambda v: v == 0,
        )
        add(
            f"{model}: throughput >= 0.80x direct at c=256",
            (row or {}).get("output_throughput_ratio"),
            "x",
            lambda v: v >= 0.80,
        )
    # The real engine's sweep runs at the few streams a CPU serves: 1, 4, 8, 16.
    row = _level(report, "named", 8) or {}
    add(
        "local: throughput >= 0.95x direct at c=8",
        row.get("output_throughput_ratio"),
        "x",
        lambda v: v >= 0.95,
    )
    add("two concurrent long answers <= 1.1x one", report["pair"]["ratio"], "x", lambda v: v <= 1.1)
    kb = report["kb"]
    for key, road in (("exact", "exact"), ("vector", "vector")):
        add(
            f"KB hit ({road}) p50 <= 15 ms at c=1",
            (kb[key] or {}).get("p50_ms"),
            "ms",
            lambda v: v <= 15,
        )
        add(
            f"KB hit ({road}) >= 100x faster than a {kb['long_tokens']}-token answer",
            kb[f"long_over_{key}"],
            "x",
            lambda v: v >= 100,
        )
    exact_p50 = (kb["exact"] or {}).get("p50_ms")
    first = report["first_question"]["latency_ms"]
    add(
        "first question after start <= 2x the KB hit p50",
        first / exact_p50 if finite(first) and finite(exact_p50) and exact_p50 else None,
        "x",
        lambda v: v <= 2,
    )
    return rows


# --- the terminal's view ------------------------------------------------------------------------


def _n(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if finite(value) else "-"


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def run_line(run: dict) -> str:
    """One run of the sweep, as it ends: a line of progress."""
    m = run["metrics"]
    cpu = run["cpu"]["gateway_cpu_ms_per_request"] if run.get("cpu") else None
    return (
        f"  {run['target']:<14} {run['label']:<6} round {run['round']}: {m['completed']} ok, "
        f"{m['failed'] + m['unfinished']} failed; "
        f"TTFT p50 {_n(m['median_ttft_ms'])} p99 {_n(m['p99_ttft_ms'])} ms; "
        f"{_n(m['output_throughput'], 0)} tok/s"
        + (f"; gateway CPU {_n(cpu, 2)} ms/req" if cpu is not None else "")
        + (f"; errors {_counts(m['errors'])}" if m["errors"] else "")
    )


def summary_text(*, report: dict) -> str:
    lines: list[str] = []
    plan = report["plan"]
    for key, title in (
        ("named", 'the endpoint named (model "local")'),
        ("auto", 'model "auto" (KB check, rules, local)'),
    ):
        sweep = report["sweep"][key]
        lines += [
            "",
            (
                f"Concurrency sweep: the gateway with {title} against the engine directly; "
                f"{plan['max_tokens']} tokens per answer, medians over {plan['rounds']} round(s)"
            ),
        ]
        header = (
            f"{'level':<7} {'TTFT p50 eng':>12} {'gw':>7} {'+p50 ms':>8} {'+p99 ms':>8} "
            f"{'tok/s eng':>9} {'gw':>7} {'ratio':>6} {'failed gw/eng':>13} "
            f"{'CPU ms/req':>10}  X-Route"
        )
        lines += [header, "-" * len(header)]
        for row in sweep["levels"]:
            lines.append(
                f"{row['label']:<7} {_n(row['engine_ttft_p50_ms']):>12} "
                f"{_n(row['gateway_ttft_p50_ms']):>7} "
                f"{_n(row['added_ttft_p50_ms']):>8} {_n(row['added_ttft_p99_ms']):>8} "
                f"{_n(row['engine_output_throughput'], 0):>9} "
                f"{_n(row['gateway_output_throughput'], 0):>7} "
                f"{_n(row['output_throughput_ratio'], 3):>6} "
                f"{str(row['gateway_failed']) + '/' + str(row['engine_failed']):>13} "
                f"{_n(row['gateway_cpu_ms_per_request'], 2):>10}  {_counts(row['routes'])}"
            )
            for who in ("gateway", "engine"):
                if row[f"{who}_errors"]:
                    lines.append(f"{'':<7} ! {who} errors: {_counts(row[f'{who}_errors'])}")
    kb, first = report["kb"], report["first_question"]
    lines += [
        "",
        (
            "KB hits against a generated long answer through /v1, one request at a time "
            "(end-to-end, ms)"
        ),
    ]
    header = f"{'':<34} {'ok/asked':>9} {'p50':>8} {'p99':>8}  X-Route"
    lines += [header, "-" * len(header)]

    def kb_line(label: str, row: dict | None) -> None:
        if row is None:
            lines.append(f"{label:<34} {'not run':>9}")
            return
        lines.append(
            f"{label:<34} {str(row['completed']) + '/' + str(row['requests']):>9} "
            f"{_n(row['p50_ms']):>8} {_n(row['p99_ms']):>8}  {_counts(row['routes'])}"
        )

    kb_line(
        "first question after the start", {**first, "p50_ms": first["latency_ms"], "p99_ms": None}
    )
    kb_line("KB hit, exact question", kb["exact"])
    kb_line("KB hit, paraphrase (vector road)", kb["vector"])
    tokens = kb["long"]["output_tokens_per_answer"]
    kb_line(f"generated answer, {kb['long_tokens']} tokens", kb["long"])
    lines.append(
        f"generated / KB hit p50: {_n(kb['long_over_exact'], 0)}x (exact), "
        f"{_n(kb['long_over_vector'], 0)}x (vector); {_n(tokens, 0)} tokens per generated answer"
    )
    pair = report["pair"]
    lines += [
        "",
        (
            f"Two concurrent {pair['long_tokens']}-token answers against one, through the gateway: "
            f"makespan {_n(pair['two_s'], 2)} s against {_n(pair['one_s'], 2)} s, "
            f"{_n(pair['ratio'], 3)}x (continuous batching: close to 1.0x); {pair['failed']} failed"
        ),
    ]
    lines += ["", "Targets"]
    width = max(len(row["target"]) for row in report["targets"]) + 2
    for row in report["targets"]:
        verdict = "not run" if row["met"] is None else ("met" if row["met"] else "MISSED")
        digits = 0 if row["unit"] == "failed" else 2 if row["unit"] == "x" else 1
        value = f"{_n(row['value'], digits)} {row['unit']}"
        lines.append(f"  {row['target']:<{width}} {value:>14}  {verdict}")
    start, end = report["load_average_start"], report["load_average_end"]
    lines += [
        "",
        (
            f"load average at the start {start[0]:.2f} {start[1]:.2f} {start[2]:.2f}, at the end "
            f"{end[0]:.2f} {end[1]:.2f} {end[2]:.2f} on {report['cpus']} CPUs "
            "(the machine is shared: other work shows up in every figure)"
        ),
    ]
    return "\n".join(lines)


def json_text(*, report: dict) -> str:
    return json.dumps(_clean(report), indent=2) + "\n"
