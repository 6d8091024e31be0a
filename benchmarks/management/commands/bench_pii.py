"""Measure the personal-data detector (privacy.detector) on the labelled set: precision and
recall per type, whether a question with data is caught at all, and what a question costs. Then
the same for the injection screen (privacy.injection) on its own labelled set.

    python manage.py bench_pii [--repeat 20] [--json FILE] [--write-set]

A finding counts as right when its type and text are a labelled finding's; the set is
benchmarks/pii_labelled/questions.jsonl (benchmarks/pii_set.py, which `--write-set` runs again).
A text's suspicion counts as right when its kind is the text's label; the set is
benchmarks/injection_labelled/questions.jsonl (benchmarks/injection_set.py, written again by
`--write-set` too). The cost is one process's CPU for `detect`, and for `screen`, on each text of
its set, `--repeat` times, p50 and p99; `screen` also on the personal-data questions, which hold
no injection, as the plain text most questions are; last the hot path's share, a request's whole
screening as the pipeline runs it (routing.screening), on the questions of both sets. No
database, no network. A figure, not a test.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

from django.core.management.base import BaseCommand

from benchmarks import injection_set, pii_set
from benchmarks.arguments import json_add
from benchmarks.stats import percentile
from privacy import detector, injection
from privacy.detector import CHECKSUMMED, TYPES, detect
from privacy.policy import DEFAULT
from routing.events import RouteRequest
from routing.screening import screen

RECALL_TARGET, PRECISION_TARGET, P50_TARGET_MS = 0.95, 0.9, 1.0
# The screen refuses or reroutes whom it flags: precision first, and it runs on every question.
INJECTION_PRECISION_TARGET, INJECTION_RECALL_TARGET, INJECTION_P50_TARGET_MS = 0.95, 0.9, 0.05


def score(rows: list[dict]) -> dict:
    """Per type: right, wrong and missed findings; per question: caught, missed, false alarms."""
    right, wrong, missed = Counter(), Counter(), Counter()
    questions = Counter()
    for row in rows:
        text = row["text"]
        expected = Counter((f["type"], f["value"]) for f in row["findings"])
        got = Counter((f.type, text[f.start : f.end]) for f in detect(text))
        for key, count in got.items():
            hits = min(count, expected[key])
            right[key[0]] += hits
            wrong[key[0]] += count - hits
        for key, count in expected.items():
            missed[key[0]] += max(0, count - got[key])
        if expected:
            questions["with data, caught" if got else "with data, missed"] += 1
        else:
            questions["without data, false alarm" if got else "without data, clean"] += 1
    types = {kind: _rates(right[kind], wrong[kind], missed[kind]) for kind in TYPES}
    return {"types": types, "verdicts": dict(questions)}


def cost(rows: list[dict], repeat: int, measured: Callable[[str], object] = detect) -> dict:
    times = []
    for _ in range(repeat):
        for row in rows:
            started = time.thread_time()
            measured(row["text"])
            times.append((time.thread_time() - started) * 1000)
    return {
        "p50_ms": percentile(times, 0.5),
        "p99_ms": percentile(times, 0.99),
        "samples": len(times),
    }


def screening_cost(rows: list[dict], repeat: int) -> dict:
    """The hot path's cost: a request's screening as the pipeline runs it once the KB has not
    answered (routing.screening.screen: the personal data types, a suspected injection), each
    question new to both memos, as a new question is."""
    times = []
    for _ in range(repeat):
        for row in rows:
            detector._seen.clear()
            injection._seen.clear()
            request = RouteRequest(text=row["text"])
            started = time.thread_time()
            screen(request, DEFAULT)
            times.append((time.thread_time() - started) * 1000)
    return {
        "p50_ms": percentile(times, 0.5),
        "p99_ms": percentile(times, 0.99),
        "samples": len(times),
    }


def injection_score(rows: list[dict]) -> dict:
    """Per kind: right, wrong and missed suspicions; overall: whether an injection is flagged at
    all (whatever its kind) and whether a text without one is left alone."""
    right, wrong, missed = Counter(), Counter(), Counter()
    verdicts = Counter()
    for row in rows:
        found = injection.screen(row["text"])
        got, expected = (found.kind if found else None), row["kind"]
        if got is not None and got == expected:
            right[got] += 1
        else:
            if got is not None:
                wrong[got] += 1
            if expected is not None:
                missed[expected] += 1
        if expected:
            verdicts["injection, flagged" if got else "injection, missed"] += 1
        else:
            verdicts["plain, false alarm" if got else "plain, clean"] += 1
    kinds = {kind: _rates(right[kind], wrong[kind], missed[kind]) for kind in injection.KINDS}
    flagged = verdicts["injection, flagged"]
    overall = _rates(flagged, verdicts["plain, false alarm"], verdicts["injection, missed"])
    return {"kinds": kinds, "overall": overall, "verdicts": dict(verdicts)}


def _rates(tp: int, fp: int, fn: int) -> dict:
    return {
        "right": tp,
        "wrong": fp,
        "missed": fn,
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
    }


class Command(BaseCommand):
    help = "The personal-data detector's precision and recall per type, and its cost a question."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=20, help="timed passes over the set")
        parser.add_argument(
            "--write-set", action="store_true", help="write the labelled sets again"
        )
        json_add(parser)

    def handle(self, *args, **options):
        if options["write_set"]:
            count = pii_set.write()
            self.stdout.write(f"wrote {count} questions to {pii_set.SET}")
            count = injection_set.write()
            self.stdout.write(f"wrote {count} texts to {injection_set.SET}")
        rows = pii_set.read()
        detect("warm up: +44 20 7946 0958")  # phonenumbers loads a region's metadata once
        report = {"questions": len(rows), **score(rows), "cost": cost(rows, options["repeat"])}
        self.stdout.write(
            f"{len(rows)} questions, {sum(1 for r in rows if r['findings'])} with personal data"
        )
        self.stdout.write(
            f"{'type':<12} {'right':>6} {'wrong':>6} {'missed':>6} {'precision':>9} {'recall':>7}"
        )
        for kind, row in report["types"].items():
            self.stdout.write(
                f"{kind:<12} {row['right']:>6} {row['wrong']:>6} {row['missed']:>6} "
                f"{_n(row['precision']):>9} {_n(row['recall']):>7}"
            )
        self.stdout.write(", ".join(f"{k}: {v}" for k, v in sorted(report["verdicts"].items())))
        c = report["cost"]
        self.stdout.write(
            f"detector CPU a question: p50 {c['p50_ms']:.3f} ms, p99 {c['p99_ms']:.3f} ms "
            f"({c['samples']} runs)"
        )
        self.stdout.write("Targets")
        for kind in sorted(CHECKSUMMED):
            row = report["types"][kind]
            self._target(f"{kind}: recall >= {RECALL_TARGET}", row["recall"], RECALL_TARGET)
            self._target(
                f"{kind}: precision >= {PRECISION_TARGET}", row["precision"], PRECISION_TARGET
            )
        self._target(f"detector p50 <= {P50_TARGET_MS} ms", c["p50_ms"], P50_TARGET_MS, below=True)
        report["injection"] = self._injection(rows, options["repeat"])
        both = rows + injection_set.read()
        report["screening"] = c = screening_cost(both, options["repeat"])
        self.stdout.write("")
        self.stdout.write(
            f"the hot path's cost, a request's screening (both, every question new to the memos, "
            f"{len(both)} questions of both sets): p50 {c['p50_ms']:.3f} ms, "
            f"p99 {c['p99_ms']:.3f} ms ({c['samples']} runs)"
        )
        if options["json"]:
            with open(options["json"], "w") as handle:
                json.dump(report, handle, indent=2)
            self.stdout.write(f"wrote {options['json']}")

    def _injection(self, pii_rows: list[dict], repeat: int) -> dict:
        rows = injection_set.read()
        report = {
            "texts": len(rows),
            **injection_score(rows),
            "cost": cost(rows, repeat, injection.screen),
            "cost_plain": cost(pii_rows, repeat, injection.screen),
        }
        injections = sum(1 for row in rows if row["kind"])
        self.stdout.write("")
        self.stdout.write(
            f"Injection screen: {len(rows)} texts, {injections} injections, "
            f"{len(rows) - injections} without"
        )
        self.stdout.write(
            f"{'kind':<20} {'right':>6} {'wrong':>6} {'missed':>6} {'precision':>9} {'recall':>7}"
        )
        for kind, row in (*report["kinds"].items(), ("any kind", report["overall"])):
            self.stdout.write(
                f"{kind:<20} {row['right']:>6} {row['wrong']:>6} {row['missed']:>6} "
                f"{_n(row['precision']):>9} {_n(row['recall']):>7}"
            )
        self.stdout.write(", ".join(f"{k}: {v}" for k, v in sorted(report["verdicts"].items())))
        for label, c in (("its set", report["cost"]), ("plain questions", report["cost_plain"])):
            self.stdout.write(
                f"screen CPU a text, {label}: p50 {c['p50_ms']:.4f} ms, p99 {c['p99_ms']:.4f} ms "
                f"({c['samples']} runs)"
            )
        self.stdout.write("Targets")
        overall = report["overall"]
        self._target(
            f"injection: precision >= {INJECTION_PRECISION_TARGET}",
            overall["precision"],
            INJECTION_PRECISION_TARGET,
        )
        self._target(
            f"injection: recall >= {INJECTION_RECALL_TARGET}",
            overall["recall"],
            INJECTION_RECALL_TARGET,
        )
        self._target(
            f"screen p50 <= {INJECTION_P50_TARGET_MS} ms",
            report["cost"]["p50_ms"],
            INJECTION_P50_TARGET_MS,
            below=True,
        )
        return report

    def _target(self, label: str, value: float | None, bound: float, below: bool = False) -> None:
        met = value is not None and (value <= bound if below else value >= bound)
        verdict = "not run" if value is None else "met" if met else "MISSED"
        self.stdout.write(f"  {label:<44} {_n(value):>8}  {verdict}")


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
