"""How well each embedding model answers directly: the labelled set through the live matcher.

    python manage.py bench_kb_quality [--set benchmarks/kb_labelled]
        [--models multilingual-e5-small,all-MiniLM-L6-v2] [--target 0.98] [--show 10]

In `bench_kb_quality_<database>` on the configured server, never the developer's data: the set's
entries are imported, embedded by every model named, and its questions calibrated per model
(knowledge.calibration), each model at its own recommended operating point and at its shipped
default. Also the time to embed one question, per model. A figure, not a test.
"""

from __future__ import annotations

import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import stack, stats
from knowledge.calibration import Result, calibrate, labelled_read
from knowledge.embedding import E5_SMALL, MINILM, embed_texts, operating_point, spec_of
from knowledge.importing import kb_import
from knowledge.models import EmbeddingModel, Entry
from knowledge.services.vectors import embedding_model_index_ensure, missing_vectors_embed

SET = Path(__file__).resolve().parents[2] / "kb_labelled"


class Command(BaseCommand):
    help = (
        "Precision and recall of the direct answer per embedding model on a labelled set, "
        "in its own database."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--set", default=str(SET), help="directory with entries.jsonl and questions.jsonl"
        )
        parser.add_argument(
            "--models", default=f"{E5_SMALL},{MINILM}", help="local models, comma-separated"
        )
        parser.add_argument(
            "--target", type=float, default=0.98, help="precision to reach (default 0.98)"
        )
        parser.add_argument("--show", type=int, default=10, help="wrong answers to list per model")

    def handle(self, *args, set, models, target, show, **options):
        folder = Path(set)
        try:
            entries = (folder / "entries.jsonl").read_text(encoding="utf-8")
            questions = (folder / "questions.jsonl").read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read the set: {exc}") from None
        names = [name.strip() for name in models.split(",") if name.strip()]
        name = f"bench_kb_quality_{settings.DATABASES['default']['NAME']}"
        with stack.stack_session(drop=name, say=self.out):
            stack.database_prepare(name=name, pool_size=2)
            Entry.objects.all().delete()
            EmbeddingModel.objects.all().delete()
            rows = [self.model_row(model_name) for model_name in names]
            report = kb_import(text=entries, fmt="jsonl", embed="none")
            if report.errors:
                raise CommandError(f"the set's entries do not import: {report.errors[:3]}")
            items = labelled_read(questions)
            self.out(
                f"{folder.name}: {report.created} entries, {len(items)} questions, "
                f"{sum(i.expected is not None for i in items)} answerable"
            )
            results = []
            for row in rows:
                started = time.perf_counter()
                missing_vectors_embed(model=row)
                embedded = time.perf_counter() - started
                result = calibrate(items, target=target, model=row)
                results.append(result)
                self.report(result, embedded=embedded, show=show)
            self.summary(results)

    def model_row(self, model_name: str) -> EmbeddingModel:
        row = EmbeddingModel.objects.create(name=model_name, backend="local", dimensions=384)
        embedding_model_index_ensure(model=row)
        return row

    def report(self, result: Result, *, embedded: float, show: int) -> None:
        spec = spec_of(result.model)
        texts = [ev.item.question + " " for ev in result.evidence[:60]]  # unseen strings: no cache
        times = []
        for text in texts:
            started = time.perf_counter()
            embed_texts(spec, [text])
            times.append(time.perf_counter() - started)
        self.out(
            f"\n== {result.model.name}: KB embedded in {embedded:.1f}s; one question embedded in "
            f"{1000 * stats.percentile(times, 0.5):.1f} ms p50 ({len(times)} questions, "
            f"{settings.KB_EMBEDDING_THREADS} thread(s))"
        )
        shipped = operating_point(result.model.name)
        at_shipped = next(
            (
                p
                for p in result.points
                if (p.threshold, p.margin) == (shipped.threshold, shipped.margin)
            ),
            None,
        )
        if at_shipped:
            self.out(
                f"at the shipped default (threshold {shipped.threshold:.3f}, "
                f"margin {shipped.margin:.3f}): "
                f"precision {at_shipped.precision:.3f}, recall {at_shipped.recall:.3f}"
            )
        chosen = result.chosen
        if chosen is None:
            best = max(result.points, key=lambda p: (p.precision, p.recall))
            self.out(
                f"no point reaches precision {result.target:.2f}; "
                f"best {best.precision:.3f} at recall {best.recall:.3f}"
            )
            return
        self.out(
            f"recommended for precision >= {result.target:.2f}: threshold {chosen.threshold:.3f}, "
            f"margin {chosen.margin:.3f}: "
            f"precision {chosen.precision:.3f}, recall {chosen.recall:.3f}"
        )
        for kind, row in sorted(result.by_kind().items()):
            answerable = row.get("answerable", 0)
            recall = (
                f"recall {row.get('correct', 0) / answerable:.2f}" if answerable else "          "
            )
            self.out(f"  {kind:<14} {row['asked']:4d} asked  {recall}  {row.get('wrong', 0)} wrong")
        for row in result.wrong[:show]:
            self.out(
                f"  wrong: {row['question'][:60]!r} -> {row['got_question'][:40]!r} "
                f"(want {row['expected_question'][:40]!r})"
            )
        grid = {(p.threshold, p.margin): p for p in result.points}
        near = [
            round(chosen.threshold + step, 3) for step in (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02)
        ]
        points = [(t, grid[(t, chosen.margin)]) for t in near if (t, chosen.margin) in grid]
        self.out(
            f"  at margin {chosen.margin:.3f}, threshold: precision/recall: "
            + ", ".join(f"{t:.3f}: {p.precision:.2f}/{p.recall:.2f}" for t, p in points)
        )

    def summary(self, results: list[Result]) -> None:
        self.out("\nmodel                    threshold margin precision recall")
        for result in results:
            chosen = result.chosen
            if chosen:
                self.out(
                    f"{result.model.name:<24} {chosen.threshold:9.3f} {chosen.margin:6.3f} "
                    f"{chosen.precision:9.3f} {chosen.recall:6.3f}"
                )
            else:
                self.out(f"{result.model.name:<24} (no point reaches the target)")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()
