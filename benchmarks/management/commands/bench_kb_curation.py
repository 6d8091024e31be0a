"""The KB's curation loop, measured: simulated days of traffic, a simulated curator after each.

    python manage.py bench_kb_curation [--days 7] [--per-day 300] [--curate 10] [--zipf 1.1]
        [--seed 28] [--users 100] [--set benchmarks/kb_labelled]

In `bench_kb_curation_<database>`, never the developer's data: the labelled set's entries are
imported and embedded by the configured model at its shipped operating point. Each day,
`--per-day` questions are drawn from the set's questions with a Zipf law over them (rank r asked
in proportion to 1 / r^zipf, the ranks a seeded shuffle): real traffic repeats itself. Each goes
through the live matcher (`knowledge.selectors.direct_answer`: exact, typo, vector); a question
not answered directly is noted as a miss with its vector, its closest entry and the reason, as
the pipeline notes it. At the day's end the misses are grouped, and the curator takes the
`--curate` largest open groups: the product's suggestion is the group's closest entry, accepted
(its questions added as phrasings, `miss_group_to_phrasings`) only when the labelled set says
every question of the group has that entry for its answer; else the group is dismissed
(`miss_groups_dismiss`), and leaves the list, as the admin's actions do.

People's verdicts: each question is asked by one of `--users` simulated users (drawn evenly),
each direct answer is kept (`knowledge.hits`) and a `--rate` share of them is rated by its user,
honestly (thumbs up when the labelled set says the entry answers it, down when not); a verdict
counts once per user and question, as in production. Each evening the curator also judges the
review queue (one row a question) by the set. After the last day,
calibration from traffic (`calibrate_from_traffic`, as `kb_calibrate --from-log` runs it)
replays the whole run with the stored vectors and those verdicts: its recommended point, the
precision the verdicts estimate there, and the true precision and hit rate there by the set,
against the serving point's.

Per day: the hit rate of answerable traffic (questions the set gives an entry, answered directly
with that entry) and the precision of the direct answers. The issue's targets: precision >= 0.98
every day, and the day's last hit rate at least twice the first. A figure, not a test.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.test import override_settings

from benchmarks import stack
from knowledge.calibration import labelled_read
from knowledge.calibration_traffic import calibrate_from_traffic
from knowledge.embedding import embed_query, spec_of
from knowledge.hits import hit_flush, hit_note, review_queue
from knowledge.importing import kb_import
from knowledge.miss_groups import miss_group_to_phrasings, miss_groups_dismiss, misses_group
from knowledge.misses import miss_flush, miss_note
from knowledge.models import EmbeddingModel, Entry, Feedback, Hit, Miss
from knowledge.selectors import direct_answer, serving_model_forget
from knowledge.services.vectors import embedding_model_ensure, missing_vectors_embed
from knowledge.services.verdicts import feedback_record, hits_review
from knowledge.typos import index_forget

SET = Path(__file__).resolve().parents[2] / "kb_labelled"


class Command(BaseCommand):
    help = "Simulated days of Zipf traffic and a curator: the direct answers' hit rate per day."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--set", default=str(SET))
        parser.add_argument("--days", type=int, default=7)
        parser.add_argument("--per-day", type=int, default=300)
        parser.add_argument("--curate", type=int, default=10, help="miss groups handled a day")
        parser.add_argument("--zipf", type=float, default=1.1, help="the Zipf law's exponent")
        parser.add_argument("--seed", type=int, default=28)
        parser.add_argument(
            "--users", type=int, default=100, help="simulated users who ask and rate"
        )
        parser.add_argument(
            "--rate", type=float, default=0.3, help="share of direct answers their user rates"
        )
        parser.add_argument(
            "--threshold",
            type=float,
            help="serve at this threshold instead of the model's shipped one (with --margin: a "
            "loose point whose wrong answers people mark, for calibration from traffic to fix)",
        )
        parser.add_argument("--margin", type=float, help="serve at this margin (see --threshold)")

    def handle(self, *args, **options):
        folder = Path(options["set"])
        try:
            entries = (folder / "entries.jsonl").read_text(encoding="utf-8")
            questions = (folder / "questions.jsonl").read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read the set: {exc}") from None
        if min(options["days"], options["per_day"], options["users"]) < 1 or options["curate"] < 0:
            raise CommandError(
                "--days, --per-day and --users must be at least 1, --curate at least 0"
            )
        name = f"bench_kb_curation_{settings.DATABASES['default']['NAME']}"
        with stack.stack_session(drop=name, say=self.stdout.write):
            stack.database_prepare(name=name, pool_size=2)
            Miss.objects.all().delete()
            Hit.objects.all().delete()
            Feedback.objects.all().delete()
            Entry.objects.all().delete()
            EmbeddingModel.objects.all().delete()
            user_ids = self.users(options["users"])
            serving_model_forget()
            index_forget()
            model = embedding_model_ensure()
            if options["threshold"] is not None or options["margin"] is not None:
                model.direct_threshold = options["threshold"]
                model.direct_margin = options["margin"]
                model.save(update_fields=["direct_threshold", "direct_margin"])
                serving_model_forget()
            report = kb_import(text=entries, fmt="jsonl", embed="none")
            if report.errors:
                raise CommandError(f"the set's entries do not import: {report.errors[:3]}")
            missing_vectors_embed(model=model)
            items = labelled_read(questions)
            self.stdout.write(
                f"{folder.name}: {report.created} entries, {len(items)} questions "
                f"({sum(i.expected is not None for i in items)} answerable); {model.name} at "
                f"threshold {model.threshold}, margin {model.margin}; {options['per_day']} "
                "questions a day, "
                f"Zipf {options['zipf']}, the {options['curate']} largest miss groups curated a day"
            )
            # The loop lives on misses and direct answers: noted whatever the environment says (a
            # test run's is off).
            with override_settings(KB_RECORD_MISSES=True, KB_RECORD_HITS=True):
                days = self.run(model, items, user_ids=user_ids, **options)
            self.summary(days)
            self.from_traffic(model, {item.question: item.expected for item in items}, days)

    @staticmethod
    def users(count: int) -> list[int]:
        """The simulated users' ids, made afresh in the benchmark's database."""
        model = get_user_model()
        model.objects.filter(username__startswith="bench-user-").delete()
        made = model.objects.bulk_create(
            [model(username=f"bench-user-{i}") for i in range(1, count + 1)]
        )
        return [user.pk for user in made]

    def run(self, model, items, *, user_ids, days, per_day, curate, zipf, seed, rate, **_):
        rng = random.Random(seed)
        raters = random.Random(seed + 1)  # apart, so the traffic drawn is the same at any --rate
        askers = random.Random(seed + 2)  # and at any --users
        ranked = list(items)
        rng.shuffle(ranked)
        weights = [1 / (rank**zipf) for rank in range(1, len(ranked) + 1)]
        expected_of = {item.question: item.expected for item in items}
        spec = spec_of(model)
        rows = []
        for day in range(1, days + 1):
            tally: Counter[str] = Counter()
            for item in rng.choices(ranked, weights=weights, k=per_day):
                verdict = direct_answer(item.question)
                answerable = item.expected is not None
                tally["answerable"] += answerable
                key = uuid.uuid4()
                user_id = askers.choice(user_ids)
                if verdict.hit:
                    right = verdict.entry.pk == item.expected
                    tally["right" if right else "wrong"] += 1
                    self.keep_hit(key, item.question, verdict, model, spec)
                    if raters.random() < rate:
                        feedback_record(
                            request_key=key,
                            user_id=user_id,
                            verdict="up" if right else "down",
                            interface="web",
                        )
                        tally["rated"] += 1
                    continue
                miss_note(
                    question=item.question,
                    answer="(a generated answer)",
                    best_entry_id=verdict.entry.pk if verdict.entry else None,
                    best_score=verdict.score,
                    model_id=model.pk,
                    vector=embed_query(spec, item.question),
                    reason=verdict.reason,
                    key=key,
                )
            miss_flush()
            hit_flush()
            misses_group()
            accepted, looked = self.curate(curate, expected_of)
            tally["reviewed"] = self.review(expected_of)
            rows.append((day, tally, accepted, looked))
            hits = tally["right"] + tally["wrong"]
            self.stdout.write(
                f"day {day}: hit rate of answerable traffic "
                f"{tally['right'] / max(1, tally['answerable']):.3f} "
                f"({tally['right']} of {tally['answerable']}), precision "
                f"{tally['right'] / hits if hits else 1.0:.3f} ({tally['wrong']} wrong); "
                f"curator: {accepted} of {looked} groups accepted, "
                f"{tally['reviewed']} questions marked wrong reviewed; "
                f"{tally['rated']} direct answers rated"
            )
        return rows

    @staticmethod
    def keep_hit(key, question, verdict, model, spec) -> None:
        """The direct answer as the pipeline keeps it: the vector when the vector road ran."""
        vector_road = verdict.method not in ("exact", "typo")
        lead = None
        if verdict.score is not None:
            lead = verdict.score - (verdict.runner_up.score if verdict.runner_up else 0.0)
        hit_note(
            key=key,
            question=question,
            entry_id=verdict.entry.pk,
            method=verdict.method,
            score=verdict.score,
            lead=lead,
            model_id=model.pk,
            vector=embed_query(spec, question) if vector_road else None,
        )

    @staticmethod
    def review(expected_of: dict[str, int | None]) -> int:
        """The curator judges the review queue by the labelled set; the number of questions
        judged (a question's one row stands for every answer of it with its entry)."""
        queue = list(review_queue())
        for verdict in ("right", "wrong"):
            hits_review(
                hit_ids=[
                    h.pk
                    for h in queue
                    if (expected_of.get(h.question) == h.entry_id) == (verdict == "right")
                ],
                verdict=verdict,
                curator=None,
            )
        return len(queue)

    def from_traffic(self, model, expected_of: dict[str, int | None], rows) -> None:
        """Calibration from the run's traffic and verdicts, checked against the labelled set."""
        result = calibrate_from_traffic(days=1, target=0.98, model=model)

        def truth(threshold: float, margin: float) -> tuple[float, float, int]:
            right = wrong = answerable = 0
            for ev in result.evidence:
                expected = expected_of.get(ev.item.question)
                answerable += expected is not None
                got = ev.answer(threshold, margin)
                if got is not None:
                    right += got == expected
                    wrong += got != expected
            answered = right + wrong
            return (right / answered if answered else 1.0), right / max(1, answerable), wrong

        judged = sum(ev.item.judged or ev.item.wrong is not None for ev in result.evidence)
        self.stdout.write(
            f"from traffic: {len(result.evidence)} questions replayed, {judged} judged "
            f"(rated, reviewed or curated)"
        )
        serving = (model.threshold, model.margin)
        points = [("serving", *serving)]
        if result.chosen is not None:
            points.append(("recommended", result.chosen.threshold, result.chosen.margin))
        for name, threshold, margin in points:
            estimate = min(
                result.points,
                key=lambda p: abs(p.threshold - threshold) + abs(p.margin - margin),
            )
            precision, hit_rate, wrong = truth(threshold, margin)
            self.stdout.write(
                f"  {name} point: threshold {threshold:.3f}, margin {margin:.3f}: precision "
                f"{estimate.precision:.3f} by the verdicts ({estimate.correct} right, "
                f"{estimate.wrong} wrong judged), {precision:.3f} by the set ({wrong} wrong); "
                f"hit rate of answerable traffic {hit_rate:.3f}"
            )
        if result.chosen is None:
            self.stdout.write("  no point reaches precision 0.98 by the verdicts")

    def curate(self, limit: int, expected_of: dict[str, int | None]) -> tuple[int, int]:
        """The `limit` largest open miss groups not dismissed: the closest entry accepted where the
        labelled set says it answers every question of the group, the group dismissed otherwise
        (the admin's actions). (accepted, looked at)."""
        heads = list(
            Miss.objects.filter(
                group__isnull=True,
                grouped_at__isnull=False,
                resolved_by=None,
                dismissed_at__isnull=True,
            )
            .select_related("best_entry")
            .order_by("-count", "id")[:limit]
        )
        accepted, refused = 0, []
        for head in heads:
            questions = {head.question} | set(
                Miss.objects.filter(group=head).values_list("question", flat=True)
            )
            suggestion = head.best_entry
            if suggestion is not None and all(
                expected_of.get(question) == suggestion.pk for question in questions
            ):
                miss_group_to_phrasings(miss=head, entry=suggestion, embed="sync")
                accepted += 1
            else:
                refused.append(head)
        miss_groups_dismiss(heads=refused)
        index_forget()  # this process's typo index reads the new phrasings now, not in 10 s
        return accepted, len(heads)

    def summary(self, rows) -> None:
        def rate(tally):
            return tally["right"] / max(1, tally["answerable"])

        def precision(tally):
            hits = tally["right"] + tally["wrong"]
            return tally["right"] / hits if hits else 1.0

        first, last = rate(rows[0][1]), rate(rows[-1][1])
        worst = min(precision(tally) for _, tally, _, _ in rows)
        self.stdout.write(
            f"precision >= 0.98 every day: {'met' if worst >= 0.98 else 'MISSED'} "
            f"(lowest {worst:.3f})"
        )
        growth = last / first if first else float("inf")
        self.stdout.write(
            f"hit rate day {rows[-1][0]} >= 2x day 1: {'met' if growth >= 2 else 'MISSED'} "
            f"({first:.3f} -> {last:.3f}, {growth:.2f}x)"
        )
