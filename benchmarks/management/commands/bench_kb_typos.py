"""Measure the typo road (knowledge.typos): how many typos of a curated phrasing it answers, with
which precision, whether any near miss gets an answer, and what a lookup costs.

    python manage.py bench_kb_typos [--sizes 1000,10000] [--repeat 5]

The typo set and near misses are benchmarks/kb_typos.py's, on the labelled KB's phrasings (the
near misses on the entries they are close to, as the test has them). The cost is one process's
CPU for `TypoIndex.find` on a miss and on a typo, p50 and p99, on the labelled KB and on synthetic
KBs of `--sizes` FAQ entries (two phrasings each, benchmarks/kb_data.py). No database: the road
answers from its index; the digest query that keeps the index current runs once per
KB_TYPO_INDEX_SECONDS per process, not per question. A figure, not a test.
"""

from __future__ import annotations

import json
import random
import time

from django.core.management.base import BaseCommand

from benchmarks import kb_data, kb_typos
from benchmarks.stats import percentile
from knowledge.normalize import normalize
from knowledge.typos import TypoIndex


def _labelled_rows(only: set[str] | None = None) -> tuple[list[tuple[int, str]], dict[int, str]]:
    rows, labels = [], {}
    for number, line in enumerate(kb_typos.ENTRIES.read_text().splitlines()):
        entry = json.loads(line)
        if entry.get("kind", "faq") != "faq" or (only is not None and entry["id"] not in only):
            continue
        labels[number] = entry["id"]
        for text in [entry["question"], *entry.get("aliases", [])]:
            rows.append((number, normalize(text)))
    return rows, labels


def _answer(index: TypoIndex, exact: dict[str, int], question: str) -> tuple[str, int | None]:
    key = normalize(question)
    if key in exact:
        return "exact", exact[key]
    typo = index.find(key)
    return ("typo", typo.entry_id) if typo else ("none", None)


def _timed(index: TypoIndex, keys: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        for key in keys:
            started = time.thread_time()
            index.find(key)
            times.append((time.thread_time() - started) * 1e6)
    return times


class Command(BaseCommand):
    help = "The typo road's hit rate, precision and near misses, and its cost per lookup."

    def add_arguments(self, parser):
        parser.add_argument("--sizes", default="1000,10000")
        parser.add_argument("--repeat", type=int, default=5)

    def handle(self, *args, **options):
        warm_started = time.perf_counter()
        from wordfreq import zipf_frequency

        zipf_frequency("warm", "en")
        self.stdout.write(f"word list loaded in {time.perf_counter() - warm_started:.2f} s")

        rows, labels = _labelled_rows()
        index, exact = TypoIndex(rows), {key: entry for entry, key in rows}
        cases = kb_typos.typo_cases()
        by_kind: dict[str, list[str]] = {}
        for case in cases:
            _road, entry = _answer(index, exact, case.question)
            verdict = (
                "none" if entry is None else "right" if labels[entry] == case.expected else "wrong"
            )
            by_kind.setdefault(case.kind, []).append(verdict)
        everything = [v for verdicts in by_kind.values() for v in verdicts]
        self.stdout.write(
            f"typo set ({len(cases)} questions, {len(rows)} phrasings of the labelled KB): "
            f"answered right {everything.count('right') / len(everything):.3f}, "
            f"wrong {everything.count('wrong')}"
        )
        for kind, verdicts in sorted(by_kind.items()):
            self.stdout.write(
                f"  {kind:8} {len(verdicts):4}: right {verdicts.count('right')}, "
                f"wrong {verdicts.count('wrong')}, none {verdicts.count('none')}"
            )

        owners = {
            entry_id
            for entry_id, phrasing in kb_typos.english_faq_phrasings()
            if normalize(phrasing) in {normalize(p) for _, p in kb_typos.NEAR_MISSES}
        }
        near_rows, _ = _labelled_rows(owners)
        near_index, near_exact = TypoIndex(near_rows), {key: entry for entry, key in near_rows}
        answered = [
            case.question
            for case in kb_typos.near_miss_cases()
            if _answer(near_index, near_exact, case.question)[1] is not None
        ]
        self.stdout.write(
            f"near misses ({len(kb_typos.NEAR_MISSES)}): answered {len(answered)} {answered}"
        )

        misses = [normalize(q) for q in kb_data.off_domain_queries(random.Random(7))]
        typo_keys = [normalize(case.question) for case in cases]
        self.stdout.write("cost of a lookup, CPU µs (p50 / p99):")
        self._cost("labelled", index, typo_keys, misses, options["repeat"])
        for size in [int(s) for s in options["sizes"].split(",") if s.strip()]:
            specs = kb_data.faq_specs(size)
            synthetic = TypoIndex(
                [
                    (n, normalize(t))
                    for n, spec in enumerate(specs)
                    for t in (spec.question, spec.alias)
                ]
            )
            asked = [normalize(spec.question)[:-1] + "x" for spec in specs[:200]]
            self._cost(f"{size} entries", synthetic, asked, misses, options["repeat"])

    def _cost(self, name, index, typo_keys, miss_keys, repeat):
        miss = _timed(index, miss_keys, repeat)
        typo = _timed(index, typo_keys, repeat)
        self.stdout.write(
            f"  {name:14} {len(index.keys):6} phrasings: miss {percentile(miss, 0.5):6.1f} / "
            f"{percentile(miss, 0.99):6.1f}; typo {percentile(typo, 0.5):6.1f} / "
            f"{percentile(typo, 0.99):6.1f}"
        )
