"""Bulk import and export of KB entries as JSONL or CSV.

Columns: question, answer, aliases, kind, tags, and an optional id. In CSV,
aliases are separated by `|` and tags by `,` or `|`; in JSONL both may be lists.

An import validates every row first, reports each bad row with its line number,
and writes all good rows in one transaction: a crash mid-way leaves nothing
half-written. A row with an id, or with the same (normalized) question as an
existing entry, updates that entry instead of adding a duplicate.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field

from django.db import transaction

from core.csvcells import csv_cell, csv_cell_read
from core.text import text_problem
from knowledge.exceptions import EntryInvalid
from knowledge.models import Entry
from knowledge.normalize import normalize
from knowledge.services.entries import entry_create, entry_update, entry_validate
from knowledge.services.vectors import embedding_models_active, missing_vectors_embed

COLUMNS = ("id", "question", "answer", "aliases", "kind", "tags")


@dataclass
class ImportReport:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)
    embedded: int = 0

    def summary(self) -> str:
        return (
            f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged, "
            f"{len(self.errors)} rejected"
        )


def detect_format(filename: str) -> str:
    lower = filename.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    raise EntryInvalid({"file": "must end in .jsonl, .ndjson or .csv"})


def _rows(text: str, fmt: str):
    """(line number, dict or error message) for each data row."""
    if fmt == "jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                yield number, f"not valid JSON ({exc.msg} at column {exc.colno})"  # type: ignore[attr-defined]  # json raises JSONDecodeError
                continue
            yield number, row if isinstance(row, dict) else "each line must be a JSON object"
        return
    reader = csv.DictReader(io.StringIO(text))
    missing = {"question", "answer"} - set(reader.fieldnames or [])
    if missing:
        yield 1, f"the header lacks {', '.join(sorted(missing))}"
        return
    for row in reader:
        # Cells as written, before an export escaped them for spreadsheets (core.csvcells).
        yield reader.line_num, {k: csv_cell_read(v) for k, v in row.items() if k is not None}


def _parse_row(row: dict, fmt: str) -> dict:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise EntryInvalid({name: "is not a known column" for name in sorted(unknown)})
    fields = {name: row[name] for name in ("question", "answer") if name in row}
    for name in ("question", "answer"):
        if not isinstance(fields.get(name), str):
            fields[name] = "" if fields.get(name) is None else fields[name]
            if not isinstance(fields[name], str):
                raise EntryInvalid({name: "must be text"})
    kind = row.get("kind") or Entry.Kind.FAQ
    fields["kind"] = kind.strip() if isinstance(kind, str) else kind
    aliases = row.get("aliases") or []
    tags = row.get("tags") or []
    if isinstance(tags, str):
        tags = tags.replace("|", ",").split(",")
    if isinstance(aliases, str):
        aliases = aliases.split("|")
    if not isinstance(aliases, list) or not isinstance(tags, list):
        raise EntryInvalid({"aliases": "must be a list or a |-separated string"})
    fields["aliases"], fields["tags"] = aliases, tags
    cleaned = entry_validate(fields)
    raw_id = row.get("id")
    text_id = raw_id.strip() if isinstance(raw_id, str) else None
    if (isinstance(raw_id, int) and not isinstance(raw_id, bool)) or (
        text_id and text_id.isdigit()
    ):
        # this instance's own id, as its export writes it
        cleaned["id"] = int(raw_id)  # type: ignore[arg-type]  # checked above
    elif text_id:
        # Another system's id (most KB exports carry one): kept as the entry's external key.
        if len(text_id) > 200 or text_problem(text_id):
            raise EntryInvalid(
                {"id": f"an external id must be up to 200 characters of text; got {raw_id!r}"}
            )
        cleaned["external_id"] = text_id
    elif raw_id not in (None, ""):
        raise EntryInvalid(
            {
                "id": f"must be this instance's whole-number id or another system's text id; "
                f"got {raw_id!r}"
            }
        )
    return cleaned


def kb_import(*, text: str, fmt: str, author=None, embed: str = "sync") -> ImportReport:
    """Import rows from `text` (`fmt` is jsonl or csv). `embed`: sync (default), async or none."""
    report = ImportReport()
    good: list[tuple[int, dict]] = []
    seen: dict[str, int] = {}
    for number, row in _rows(text, fmt):
        if isinstance(row, str):
            report.errors.append((number, row))
            continue
        try:
            fields = _parse_row(row, fmt)
        except EntryInvalid as exc:
            report.errors.append((number, str(exc)))
            continue
        key = (
            f"id:{fields['id']}"
            if "id" in fields
            else f"external:{fields['external_id']}"
            if "external_id" in fields
            else normalize(fields["question"])
        )
        if key in seen:
            report.errors.append((number, f"duplicates line {seen[key]}"))
            continue
        seen[key] = number
        good.append((number, fields))

    ids = [fields["id"] for _, fields in good if "id" in fields]
    by_id = Entry.objects.in_bulk(ids)
    for number, fields in list(good):
        if "id" in fields and fields["id"] not in by_id:
            report.errors.append((number, f"no entry has id {fields['id']}"))
            good.remove((number, fields))
    report.errors.sort()

    touched: list[int] = []
    row_embed = "async" if embed == "async" else "none"
    with transaction.atomic():
        by_question = {normalize(e.question): e for e in Entry.objects.all().only("id", "question")}
        externals = [fields["external_id"] for _, fields in good if "external_id" in fields]
        by_external = {e.external_id: e for e in Entry.objects.filter(external_id__in=externals)}
        for _, fields in good:
            entry_id = fields.pop("id", None)
            external_id = fields.pop("external_id", None)
            if entry_id:
                existing = by_id.get(entry_id)
            elif external_id:
                existing = by_external.get(external_id) or by_question.get(
                    normalize(fields["question"])
                )
            else:
                existing = by_question.get(normalize(fields["question"]))
            if existing is None:
                entry = entry_create(**fields, author=author, embed=row_embed)
                report.created += 1
            else:
                before = existing.version, _snapshot(existing), existing.external_id
                entry = entry_update(entry=existing, embed=row_embed, **fields)
                changed = (
                    entry.version,
                    _snapshot(entry),
                    external_id or existing.external_id,
                ) != before
                report.updated += changed
                report.unchanged += not changed
            if external_id and entry.external_id != external_id:
                Entry.objects.filter(pk=entry.pk).update(external_id=external_id)
            touched.append(entry.pk)
    if embed == "sync" and touched:
        # One batched pass over everything missing: far faster than one model call per entry.
        for model in embedding_models_active():
            report.embedded += missing_vectors_embed(model=model)
    return report


def _snapshot(entry: Entry) -> tuple:
    return (entry.kind, entry.question, list(entry.aliases), entry.answer, list(entry.tags))


def kb_export(*, fmt: str, entries=None) -> str:
    entries = entries if entries is not None else Entry.objects.order_by("pk")
    if fmt == "jsonl":
        return "".join(
            json.dumps(
                {
                    "id": e.external_id or e.pk,
                    "question": e.question,
                    "answer": e.answer,
                    "aliases": e.aliases,
                    "kind": e.kind,
                    "tags": e.tags,
                },
                ensure_ascii=False,
            )
            + "\n"
            for e in entries
        )
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for e in entries:
        writer.writerow(
            [
                csv_cell(cell)
                for cell in (
                    e.external_id or e.pk,
                    e.question,
                    e.answer,
                    "|".join(e.aliases),
                    e.kind,
                    ",".join(e.tags),
                )
            ]
        )
    return out.getvalue()
