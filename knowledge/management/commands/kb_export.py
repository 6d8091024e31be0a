import csv
import io
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge.exceptions import EntryInvalid
from knowledge.importing import detect_format, kb_export


class Command(BaseCommand):
    help = "Export every KB entry as .jsonl or .csv, in the format kb_import reads (- for stdout)."

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--format", choices=["jsonl", "csv"])

    def handle(self, *args, file, format, **options):
        try:
            fmt = format or ("jsonl" if file == "-" else detect_format(file))
        except EntryInvalid as exc:
            raise CommandError(str(exc)) from None
        text = kb_export(fmt=fmt)
        if file == "-":
            sys.stdout.write(text)
        else:
            Path(file).write_text(text, encoding="utf-8")
            # A CSV answer may span lines: count its rows, not its lines.
            count = (
                text.count("\n")
                if fmt == "jsonl"
                else sum(1 for _ in csv.reader(io.StringIO(text))) - 1
            )
            self.stdout.write(f"wrote {count} entries to {file}")
