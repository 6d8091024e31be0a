from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge.exceptions import EntryInvalid
from knowledge.importing import detect_format, kb_import


class Command(BaseCommand):
    help = "Import KB entries from a .jsonl or .csv file (idempotent: same id or question updates)."

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument(
            "--format", choices=["jsonl", "csv"], help="default: from the file name"
        )
        parser.add_argument(
            "--embed",
            choices=["sync", "async", "none"],
            default="sync",
            help=(
                "sync (default): entries answer as soon as the command returns; "
                "async: Celery embeds them"
            ),
        )

    def handle(self, *args, file, format, embed, **options):
        path = Path(file)
        try:
            fmt = format or detect_format(path.name)
            text = path.read_text(encoding="utf-8-sig")
        except EntryInvalid as exc:
            raise CommandError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        report = kb_import(text=text, fmt=fmt, embed=embed)
        for line, message in report.errors:
            self.stderr.write(f"{path.name}:{line}: {message}")
        self.stdout.write(
            report.summary() + (f"; {report.embedded} vectors computed" if report.embedded else "")
        )
        if report.errors:
            raise CommandError(
                f"{len(report.errors)} row(s) rejected; the other rows were imported"
            )
