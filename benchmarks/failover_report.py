"""The failover scorecard's table (benchmarks.failover): a line per scenario and mode, the
verdicts per mode, and what a continuation after a cut cost the caller."""

from __future__ import annotations

import statistics

from benchmarks.failover import FALLBACK, PRIMARY, VERDICTS


def _attempts_text(row: dict) -> str:
    counts = row["attempts"]
    text = f"{counts[PRIMARY]}/{counts[FALLBACK]}"
    if row["prefill_attempts"]:
        text += f" ({row['prefill_attempts']} prefill)"
    return text


def row_line(row: dict) -> str:
    gaps = ",".join(f"{g:g}" for g in row["gaps_s"][:3]) or "-"
    if len(row["gaps_s"]) > 3:
        gaps += f",…({len(row['gaps_s'])})"
    return (
        f"{row['scenario']:<20} {row['mode']:<6} {row['verdict']:<8} "
        f"{_attempts_text(row):<14} {gaps:<16} {row['time_s']:>6.2f}  {row['got']}"
    )


HEADER = (
    f"{'scenario':<20} {'mode':<6} {'verdict':<8} {'attempts p/f':<14} {'gaps s':<16} "
    f"{'time s':>6}  what the caller got"
)


def table_text(report: dict) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [row_line(row) for row in report["rows"]]
    lines.append("")
    for mode, counts in report["totals"].items():
        lines.append(f"{mode:<6} " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS))
    if line := continuation_line(report["rows"]):
        lines.append(line)
    return "\n".join(lines)


# Scenarios whose stream is cut at once (no idle timeout to wait out first) and then continued.
CUT_AT_ONCE = ("cut-mid-stream", "no-done", "accounting", "prefill-refused")


def continuation_line(rows: list[dict]) -> str | None:
    """A continuation's cost as the caller sees it: the longest wait between two tokens of the
    whole answers of the scenarios cut at once (from the last token before the cut to the first
    after it), their median and range."""
    gaps = sorted(
        r["longest_gap_s"]
        for r in rows
        if r["scenario"] in CUT_AT_ONCE
        and r["verdict"] == "pass"
        and r.get("prefill_attempts")
        and r.get("longest_gap_s") is not None
    )
    if not gaps:
        return None
    median = statistics.median(gaps)
    return (
        f"continued after a cut: the caller waited {median * 1000:.0f} ms from the last token "
        f"before it to the first after (median of {len(gaps)}; {gaps[0] * 1000:.0f}–"
        f"{gaps[-1] * 1000:.0f} ms)"
    )
