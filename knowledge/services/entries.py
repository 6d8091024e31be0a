"""Writes of entries. Validate, then mutate; embedding happens after commit
(knowledge.services.vectors)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from core.text import text_problem
from knowledge.exceptions import EntryInvalid
from knowledge.models import Entry, Passage, Phrasing
from knowledge.normalize import normalize
from knowledge.services.vectors import entry_embed

# The task that embeds an entry after a write (knowledge.tasks defines it under this name).
ENTRY_EMBED_TASK = "knowledge.tasks.entry_embed"

TEXT_FIELDS = ("kind", "question", "aliases", "answer")
EDITABLE_FIELDS = (*TEXT_FIELDS, "tags", "active", "threshold")


def _clean_list(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = re.split(r"[\n|]", values)
    out: list[str] = []
    for value in values:
        value = str(value).strip()
        if value and value not in out:
            out.append(value)
    return out


def entry_validate(fields: dict) -> dict:
    """Return cleaned fields or raise EntryInvalid naming each bad field."""
    errors: dict[str, str] = {}
    cleaned = dict(fields)
    for name in ("question", "answer"):
        if name in cleaned:
            cleaned[name] = str(cleaned[name] or "").strip()
            if not cleaned[name]:
                errors[name] = "must not be empty"
            elif problem := text_problem(cleaned[name]):
                errors[name] = problem
            elif not normalize(cleaned[name]) and name == "question":
                errors[name] = "must contain letters or digits"
    if "kind" in cleaned and cleaned["kind"] not in Entry.Kind.values:
        errors["kind"] = f"must be one of {', '.join(Entry.Kind.values)}; got {cleaned['kind']!r}"
    if "aliases" in cleaned:
        cleaned["aliases"] = _clean_list(cleaned["aliases"])
        if problem := next(filter(None, map(text_problem, cleaned["aliases"])), None):
            errors["aliases"] = f"an alias {problem}"
    if "tags" in cleaned:
        cleaned["tags"] = [tag.lower() for tag in _clean_list(cleaned["tags"])]
        if any(len(tag) > 64 for tag in cleaned["tags"]):
            errors["tags"] = "each tag must be at most 64 characters"
        elif problem := next(filter(None, map(text_problem, cleaned["tags"])), None):
            errors["tags"] = f"a tag {problem}"
    if cleaned.get("threshold") is not None:
        try:
            cleaned["threshold"] = float(cleaned["threshold"])
        except (TypeError, ValueError):
            errors["threshold"] = "must be a number between 0 and 1"
        else:
            if not 0 <= cleaned["threshold"] <= 1:
                errors["threshold"] = "must be a number between 0 and 1"
    if errors:
        raise EntryInvalid(errors)
    return cleaned


def entry_create(
    *,
    question: str,
    answer: str,
    kind: str = Entry.Kind.FAQ,
    aliases: Iterable[str] | str = (),
    tags: Iterable[str] | str = (),
    active: bool = True,
    threshold: float | None = None,
    author=None,
    embed: str = "async",
    needs_review: bool = False,
) -> Entry:
    """Create an entry. `embed`: "async" (Celery, after commit), "sync" (now), or "none".
    `needs_review`: it waits, inactive, until a curator activates it (see `Entry.needs_review`)."""
    fields = entry_validate(
        {
            "question": question,
            "answer": answer,
            "kind": kind,
            "aliases": aliases,
            "tags": tags,
            "threshold": threshold,
        }
    )
    if needs_review and active:
        raise EntryInvalid(
            {"active": "an entry awaiting review is inactive until a curator activates it"}
        )
    with transaction.atomic():
        entry = Entry.objects.create(
            **fields, active=active, needs_review=needs_review, author=author
        )
        _rebuild_texts(entry)
        _after_text_change(entry, embed)
    return entry


def entry_update(*, entry: Entry, embed: str = "async", **changes) -> Entry:
    """Update an entry. A text change replaces its phrasings and passages in the same
    transaction, so the old wording can never answer again, and bumps `version`."""
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise EntryInvalid({name: "is not an editable field" for name in sorted(unknown)})
    changes = entry_validate(changes)
    with transaction.atomic():
        entry = Entry.objects.select_for_update().get(pk=entry.pk)
        text_changed = any(
            name in changes and getattr(entry, name) != changes[name] for name in TEXT_FIELDS
        )
        for name, value in changes.items():
            setattr(entry, name, value)
        if entry.active and entry.needs_review:  # a curator activated it: that was the review
            entry.needs_review, entry.reviewed_at = False, timezone.now()
        if text_changed:
            entry.version += 1
        entry.save()
        if text_changed:
            _rebuild_texts(entry)
            _after_text_change(entry, embed)
    return entry


def entry_add_phrasings(*, entry: Entry, texts: Iterable[str], embed: str = "async") -> list[str]:
    """Attach `texts` to a FAQ entry as aliases; the texts added. Unlike an edit of its aliases
    (entry_update), the entry keeps its phrasings and their vectors, so it answers its old
    wordings throughout; only the new ones are embedded. A text the entry or another entry
    already has (normalized) is left out: one wording answers with one entry."""
    cleaned = entry_validate({"aliases": list(texts)})["aliases"]
    with transaction.atomic():
        entry = Entry.objects.select_for_update().get(pk=entry.pk)
        if entry.kind != Entry.Kind.FAQ:
            raise EntryInvalid({"kind": "only an FAQ entry has phrasings to add to"})
        keys = {text: normalize(text) for text in cleaned}
        taken = set(
            Phrasing.objects.filter(normalized__in=set(keys.values())).values_list(
                "normalized", flat=True
            )
        )
        added = []
        for text, key in keys.items():
            if key and key not in taken:
                taken.add(key)
                added.append(text)
        if not added:
            return []
        entry.aliases = [*entry.aliases, *added]
        entry.version += 1  # an embedding still running for the old phrasings embeds these too
        entry.save(update_fields=["aliases", "version", "updated_at"])
        Phrasing.objects.bulk_create(
            [Phrasing(entry=entry, text=text, normalized=keys[text]) for text in added]
        )
        _after_text_change(entry, embed)
    return added


def entries_set_active(*, ids: Iterable[int], active: bool) -> int:
    """(De)activate entries; the number changed. Activating an entry awaiting review reviews it."""
    now = timezone.now()
    review = (
        {
            "needs_review": False,
            "reviewed_at": Case(When(needs_review=True, then=Value(now)), default=F("reviewed_at")),
        }
        if active
        else {}
    )
    return (
        Entry.objects.filter(pk__in=list(ids))
        .exclude(active=active)
        .update(active=active, updated_at=now, **review)
    )


def entry_delete(*, entry: Entry) -> None:
    entry.delete()


def _rebuild_texts(entry: Entry) -> None:
    entry.phrasings.all().delete()
    entry.passages.all().delete()
    if entry.kind == Entry.Kind.FAQ:
        # Only FAQ entries answer directly, so only they need matchable phrasings.
        seen = set()
        rows = []
        for index, text in enumerate([entry.question, *entry.aliases]):
            key = normalize(text)
            if key and key not in seen:
                seen.add(key)
                rows.append(Phrasing(entry=entry, text=text, normalized=key, primary=index == 0))
        Phrasing.objects.bulk_create(rows)
    if entry.kind == Entry.Kind.DOCUMENT:
        chunks = split_passages(entry.answer, settings.KB_PASSAGE_CHARS)
    else:
        chunks = [f"{entry.question}\n{entry.answer}"]
    Passage.objects.bulk_create(
        [Passage(entry=entry, ordinal=i, text=chunk) for i, chunk in enumerate(chunks)]
    )


def split_passages(text: str, limit: int) -> list[str]:
    """Paragraphs packed into passages of at most `limit` characters; a longer paragraph
    is cut at sentence ends. A rule book is then retrieved by the paragraph that matters."""
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        paragraph = paragraph.strip()
        while len(paragraph) > limit:
            cut = max(
                paragraph.rfind(mark, 0, limit) for mark in (". ", "。", "! ", "? ", "；", "\n")
            )
            cut = cut + 1 if cut > limit // 3 else limit
            pieces.append(paragraph[:cut].strip())
            paragraph = paragraph[cut:].strip()
        if paragraph:
            pieces.append(paragraph)
    passages: list[str] = []
    for piece in pieces:
        if passages and len(passages[-1]) + 2 + len(piece) <= limit:
            passages[-1] += "\n\n" + piece
        else:
            passages.append(piece)
    return passages or [text.strip()]


def _after_text_change(entry: Entry, embed: str) -> None:
    if embed == "sync":
        entry_embed(entry_id=entry.pk, version=entry.version)
    elif embed == "async":
        # By name: knowledge.tasks calls these services, so they do not import it back.
        entry_id, version = entry.pk, entry.version
        transaction.on_commit(
            lambda: current_app.send_task(ENTRY_EMBED_TASK, args=(entry_id, version))
        )
