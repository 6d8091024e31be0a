from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge.calibration import calibrate, curve, labelled_read
from knowledge.calibration_traffic import calibrate_from_traffic, traffic_source
from knowledge.exceptions import EntryInvalid
from knowledge.services.calibrations import calibration_save


class Command(BaseCommand):
    help = (
        "Run labelled questions (JSONL: question, expected entry id or external id or null), or "
        "with --from-log the last days' traffic with its stored vectors and people's verdicts, "
        "through the direct-answer matcher; print precision, recall and hit rate across "
        "thresholds and margins and the operating point for a target precision; --apply makes it "
        "the serving model's."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="a labelled JSONL file (or --from-log)")
        parser.add_argument(
            "--from-log",
            action="store_true",
            help="replay the direct answers and misses of the last --days days instead of a file",
        )
        parser.add_argument(
            "--days", type=int, default=7, help="with --from-log: days replayed (default 7)"
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=20000,
            help="with --from-log: the newest direct answers and misses each (default 20000)",
        )
        parser.add_argument(
            "--target", type=float, default=0.98, help="precision to reach (default 0.98)"
        )
        parser.add_argument(
            "--apply", action="store_true", help="set the recommended point on the serving model"
        )
        parser.add_argument(
            "--show", type=int, default=20, help="wrong and missed questions to list (default 20)"
        )

    def handle(self, *args, file, from_log, days, limit, target, apply, show, **options):
        if not 0 < target <= 1:
            raise CommandError("--target must be in (0, 1]")
        if bool(file) == from_log:
            raise CommandError("give a labelled file or --from-log (one of them)")
        if from_log:
            if days < 1 or limit < 1:
                raise CommandError("--days and --limit must be at least 1")
            try:
                result = calibrate_from_traffic(days=days, target=target, limit=limit)
            except EntryInvalid as exc:
                raise CommandError("; ".join(exc.errors.values())) from None
            source = traffic_source(days, result)
        else:
            path = Path(file)
            try:
                items = labelled_read(path.read_text(encoding="utf-8-sig"))
                result = calibrate(items, target=target)
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read {path}: {exc}") from None
            except EntryInvalid as exc:
                lines = (line for message in exc.errors.values() for line in message.splitlines())
                raise CommandError("\n".join(f"{path.name}: {line}" for line in lines)) from None
            source = path.name
        run = calibration_save(result=result, source=source, apply=apply)
        out = self.stdout.write
        asked = source if from_log else f"{len(result.evidence)} questions"
        out(
            f"model {result.model.name}: {asked}, {result.answerable} answerable; "
            f"now serving at threshold "
            f"{result.model.threshold:.3f}, margin {result.model.margin:.3f}"
        )
        if from_log:
            now = _at(result.points, result.model.threshold, result.model.margin)
            if now is not None:
                out(
                    f"at the serving point: precision {now.precision:.3f} ({now.correct} right, "
                    f"{now.wrong} wrong of those judged), hit rate {now.hit_rate:.3f}"
                )
        out("")
        out(
            f"{'threshold':>9} {'margin':>6} {'precision':>9} {'recall':>6} {'answered':>8} "
            f"{'hit rate':>8}"
        )
        for p in curve(result.points, result.target)[::4]:
            out(
                f"{p.threshold:9.3f} {p.margin:6.3f} {p.precision:9.3f} {p.recall:6.3f} "
                f"{p.answered:8d} {p.hit_rate:8.3f}"
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
                f"-> precision {chosen.precision:.3f}, recall {chosen.recall:.3f}, "
                f"hit rate {chosen.hit_rate:.3f} ({chosen.correct} right, {chosen.wrong} wrong, "
                f"{chosen.answered} answered)"
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
                            f" -> KB#{row['got']} {row['got_question'][:50]!r}"  # type: ignore[index]  # row: a dict of the rows here
                            if row["got"]
                            else ""
                        )
                        want = f"KB#{row['expected']}" if row["expected"] else "none"
                        out(
                            f"  line {row['line']} [{row['kind']}] {row['question'][:70]!r}{got} "  # type: ignore[index]  # row: a dict of the rows here
                            f"(want {want}; score {row['score']:.3f}, lead {row['lead']:.3f}"
                            f"{'; ' + row['guard'] if row['guard'] else ''})"  # type: ignore[operator]  # row: a dict of the rows here
                        )
        out("")
        if run.applied:
            out(
                f"applied: {result.model.name} now answers directly "
                f"at threshold {chosen.threshold:.3f}, margin {chosen.margin:.3f}"  # type: ignore[union-attr]  # an applied run has its point
            )
        out(f"saved as calibration #{run.pk} (admin: Knowledge › Calibrations)")


def _at(points, threshold: float, margin: float):
    """The grid's point nearest to (threshold, margin)."""
    return min(
        points,
        key=lambda p: (abs(p.threshold - threshold), abs(p.margin - margin)),
        default=None,
    )
