from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge.calibration import calibrate, calibration_save, curve, labelled_read
from knowledge.exceptions import EntryInvalid


class Command(BaseCommand):
    help = (
        "Run labelled questions (JSONL: question, expected entry id or external id or null) "
        "through the direct-answer matcher; print precision and recall across thresholds and "
        "margins and the operating point for a target precision; --apply makes it the serving "
        "model's."
    )

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument(
            "--target", type=float, default=0.98, help="precision to reach (default 0.98)"
        )
        parser.add_argument(
            "--apply", action="store_true", help="set the recommended point on the serving model"
        )
        parser.add_argument(
            "--show", type=int, default=20, help="wrong and missed questions to list (default 20)"
        )

    def handle(self, *args, file, target, apply, show, **options):
        if not 0 < target <= 1:
            raise CommandError("--target must be in (0, 1]")
        path = Path(file)
        try:
            items = labelled_read(path.read_text(encoding="utf-8-sig"))
            result = calibrate(items, target=target)
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        except EntryInvalid as exc:
            lines = (line for message in exc.errors.values() for line in message.splitlines())
            raise CommandError("\n".join(f"{path.name}: {line}" for line in lines)) from None
        run = calibration_save(result, source=path.name, apply=apply)
        out = self.stdout.write
        out(
            f"model {result.model.name}: {len(items)} questions, {result.answerable} answerable; "
            f"now serving at threshold {result.model.threshold:.3f}, "
            f"margin {result.model.margin:.3f}"
        )
        out("")
        out(f"{'threshold':>9} {'margin':>6} {'precision':>9} {'recall':>6} {'answered':>8}")
        for p in curve(result.points, result.target)[::4]:
            out(
                f"{p.threshold:9.3f} {p.margin:6.3f} {p.precision:9.3f} {p.recall:6.3f} "
                f"{p.answered:8d}"
            )
        out("")
        chosen = result.chosen
        if chosen is None:
            best = max(result.points, key=lambda p: (p.precision, p.recall))
            out(
                f"no operating point reaches precision {target:.2f}; "
                f"the best is {best.precision:.3f} (recall {best.recall:.3f}) "
                f"at threshold {best.threshold:.3f}, margin {best.margin:.3f}"
            )
        else:
            out(
                f"recommended for precision >= {target:.2f}: "
                f"threshold {chosen.threshold:.3f}, margin {chosen.margin:.3f} "
                f"-> precision {chosen.precision:.3f}, recall {chosen.recall:.3f} "
                f"({chosen.correct} right of {chosen.answered} answered)"
            )
            out("")
            out(
                f"{'kind':<14} {'asked':>5} {'answerable':>10} {'answered':>8} "
                f"{'correct':>7} {'wrong':>5}"
            )
            for kind, row in sorted(result.by_kind().items()):
                out(
                    f"{kind:<14} {row.get('asked', 0):5d} {row.get('answerable', 0):10d} "
                    f"{row.get('answered', 0):8d} {row.get('correct', 0):7d} "
                    f"{row.get('wrong', 0):5d}"
                )
            for title, rows in (("wrong direct answers", result.wrong), ("missed", result.missed)):
                if rows and show:
                    out("")
                    out(f"{title} ({len(rows)}):")
                    for row in rows[:show]:
                        got = (
                            f" -> KB#{row['got']} {row['got_question'][:50]!r}"
                            if row["got"]
                            else ""
                        )
                        want = f"KB#{row['expected']}" if row["expected"] else "none"
                        out(
                            f"  line {row['line']} [{row['kind']}] {row['question'][:70]!r}{got} "
                            f"(want {want}; score {row['score']:.3f}, lead {row['lead']:.3f}"
                            f"{'; ' + row['guard'] if row['guard'] else ''})"
                        )
        out("")
        if run.applied:
            out(
                f"applied: {result.model.name} now answers directly "
                f"at threshold {chosen.threshold:.3f}, margin {chosen.margin:.3f}"
            )
        out(f"saved as calibration #{run.pk} (admin: Knowledge › Calibrations)")
