"""Writes to the knowledge base. Validate, then mutate; embedding happens after commit."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from core.text import text_problem
from knowledge.embedding import PASSAGE, EmbeddingSpec, embed_texts, spec_of
from knowledge.exceptions import EntryInvalid
from knowledge.models import (
    EmbeddingModel,
    Entry,
    Feedback,
    Hit,
    Passage,
    PassageVector,
    Phrasing,
    PhrasingVector,
)
from knowledge.normalize import normalize

# The task that embeds an entry after a write (knowledge.tasks defines it under this name).
ENTRY_EMBED_TASK = "knowledge.tasks.entry_embed"

TEXT_FIELDS = ("kind", "question", "aliases", "answer")
EDITABLE_FIELDS = (*TEXT_FIELDS, "tags", "active", "threshold")

# --- embedding models -------------------------------------------------------------------------


def configured_spec() -> EmbeddingSpec:
    return EmbeddingSpec(
        name=settings.KB_EMBEDDING_MODEL,
        backend=settings.KB_EMBEDDING_BACKEND,
        dimensions=settings.KB_EMBEDDING_DIMENSIONS,
        base_url=settings.KB_EMBEDDING_BASE_URL or "",
        api_key_env=settings.KB_EMBEDDING_API_KEY_ENV or "",
        query_prefix=settings.KB_EMBEDDING_QUERY_PREFIX,
        passage_prefix=settings.KB_EMBEDDING_PASSAGE_PREFIX,
    )


def embedding_model_ensure() -> EmbeddingModel:
    """The row of the configured model; on a fresh database it serves at once (nothing to
    re-embed)."""
    spec = configured_spec()
    with transaction.atomic():
        model, _ = EmbeddingModel.objects.select_for_update().get_or_create(
            name=spec.name,
            defaults={
                "backend": spec.backend,
                "dimensions": spec.dimensions,
                "base_url": spec.base_url,
                "api_key_env": spec.api_key_env,
                "query_prefix": spec.query_prefix,
                "passage_prefix": spec.passage_prefix,
            },
        )
        if (
            model.state != EmbeddingModel.State.SERVING
            and not EmbeddingModel.objects.filter(state=EmbeddingModel.State.SERVING).exists()
        ):
            _embedding_model_promote(model)
        elif model.state == EmbeddingModel.State.RETIRED:
            model.state = EmbeddingModel.State.BUILDING
            model.save(update_fields=["state"])
    embedding_model_index_ensure(model=model)
    return model


def embedding_model_index_ensure(*, model: EmbeddingModel) -> None:
    """Partial HNSW indexes for one model's vectors (cosine); idempotent."""
    with connection.cursor() as cursor:
        if connection.in_atomic_block:
            # Deferred foreign-key checks of earlier inserts would block the DDL; run them now,
            # as Django's schema editor does before altering a table inside a transaction.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table in ("knowledge_phrasingvector", "knowledge_passagevector"):
            # Identifiers built from integers only: nothing user-supplied reaches this DDL.
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {table}_hnsw_m{int(model.pk)} ON {table} "
                f"USING hnsw ((embedding::vector({int(model.dimensions)})) vector_cosine_ops) "
                f"WHERE model_id = {int(model.pk)}"
            )
        if connection.in_atomic_block:
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def _embedding_model_promote(model: EmbeddingModel) -> None:
    EmbeddingModel.objects.filter(state=EmbeddingModel.State.SERVING).exclude(pk=model.pk).update(
        state=EmbeddingModel.State.RETIRED
    )
    model.state = EmbeddingModel.State.SERVING
    model.serving_since = timezone.now()
    model.save(update_fields=["state", "serving_since"])


def embedding_models_active() -> list[EmbeddingModel]:
    """Models that need vectors for new text: the serving one and any being built."""
    models = list(
        EmbeddingModel.objects.filter(
            state__in=[EmbeddingModel.State.SERVING, EmbeddingModel.State.BUILDING]
        )
    )
    return models or [embedding_model_ensure()]


def kb_reembed(*, batch_size: int = 128, progress=None) -> EmbeddingModel:
    """Embed everything with the configured model, then let it serve.

    The serving model keeps answering until every phrasing and passage has a
    vector of the new model; the switch is one transaction. The old model's
    vectors are dropped by the next re-embed.
    """
    # Vectors of models retired by an earlier switch go now; the model this run retires keeps
    # its vectors, because processes trust their cached idea of the serving model for a few seconds.
    PhrasingVector.objects.filter(model__state=EmbeddingModel.State.RETIRED).delete()
    PassageVector.objects.filter(model__state=EmbeddingModel.State.RETIRED).delete()
    model = embedding_model_ensure()
    missing_vectors_embed(model=model, batch_size=batch_size, progress=progress)
    with transaction.atomic():
        model = EmbeddingModel.objects.select_for_update().get(pk=model.pk)
        if _missing(
            model
        ).exists():  # entries edited meanwhile: their tasks embed them for both models
            missing_vectors_embed(model=model, batch_size=batch_size)
        if model.state != EmbeddingModel.State.SERVING:
            _embedding_model_promote(model)
    return model


def _missing(model: EmbeddingModel):
    return Phrasing.objects.exclude(vectors__model=model)


def missing_vectors_embed(*, model: EmbeddingModel, batch_size: int = 128, progress=None) -> int:
    """Embed every phrasing and passage that has no vector of `model`. Returns how many."""
    spec = spec_of(model)
    done = 0
    for owner, vector_model, field in (
        (Phrasing, PhrasingVector, "phrasing"),
        (Passage, PassageVector, "passage"),
    ):
        while True:
            rows = list(
                owner.objects.exclude(vectors__model=model)
                .select_related("entry")
                .order_by("pk")[:batch_size]
            )
            if not rows:
                break
            vectors = embed_texts(spec, [_embedding_text(row) for row in rows], PASSAGE)
            vector_model.objects.bulk_create(
                [
                    vector_model(**{field: row}, model=model, embedding=vector)
                    for row, vector in zip(rows, vectors)
                ],
                ignore_conflicts=True,
            )
            done += len(rows)
            if progress:
                progress(done)
    return done


def _embedding_text(row: Phrasing | Passage) -> str:
    if isinstance(row, Phrasing):
        return row.text
    # A passage is embedded with its entry's title: a paragraph alone often lacks its subject.
    if row.entry.kind == Entry.Kind.DOCUMENT:
        return f"{row.entry.question}\n{row.text}"
    return row.text


# --- entries ----------------------------------------------------------------------------------


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


def entry_embed(*, entry_id: int, version: int | None = None) -> bool:
    """Embed one entry's phrasings and passages for every active model.

    Safe to run twice and safe to run late: it does nothing for a deleted entry or
    for an entry edited since `version` (the newer edit has its own task).
    """
    entry = Entry.objects.filter(pk=entry_id).first()
    if entry is None or (version is not None and entry.version != version):
        return False
    phrasings = list(entry.phrasings.all())
    passages = list(entry.passages.select_related("entry"))
    computed = []
    for model in embedding_models_active():
        spec = spec_of(model)
        # The model runs outside any transaction: a slow embedding holds no row lock.
        computed.append(
            (
                model,
                embed_texts(spec, [_embedding_text(p) for p in phrasings], PASSAGE),
                embed_texts(spec, [_embedding_text(p) for p in passages], PASSAGE),
            )
        )
    with transaction.atomic():
        current = Entry.objects.select_for_update().filter(pk=entry_id).first()
        if current is None or current.version != entry.version:
            return False
        for model, phrasing_vectors, passage_vectors in computed:
            PhrasingVector.objects.bulk_create(
                [
                    PhrasingVector(phrasing=p, model=model, embedding=v)
                    for p, v in zip(phrasings, phrasing_vectors)
                ],
                ignore_conflicts=True,
            )
            PassageVector.objects.bulk_create(
                [
                    PassageVector(passage=p, model=model, embedding=v)
                    for p, v in zip(passages, passage_vectors)
                ],
                ignore_conflicts=True,
            )
    return True


# --- verdicts on answers ----------------------------------------------------------------------

FEEDBACK_COMMENT_CHARS = 2000


def feedback_record(
    *,
    request_key,
    user_id: int | None,
    verdict: str,
    comment: str = "",
    interface: str,
    reviewable: bool = True,
) -> Feedback | None:
    """Keep a user's verdict on one answer (`up` or `down`), replacing one given before; an empty
    verdict takes it back (None). Raises EntryInvalid for a verdict or comment it cannot keep.

    A thumbs down on a direct answer puts its Hit in the review queue while its user is within
    KB_REVIEW_DOWNVOTES_PER_DAY (the row's `queued` says whether it did); past that it is kept,
    and counts in calibration as any verdict does, but it queues nothing. `reviewable` is False for
    an answer known not to be a direct one (a model's): no queue to enter, none of the allowance
    used. The default counts it, for an answer whose road is not known here (a /v1 completion:
    the KB's record of it is written a moment after it ends, and the verdict may come first)."""
    if verdict not in ("", *Feedback.Verdict.values):
        raise EntryInvalid({"verdict": "must be `up`, `down` or empty (to take it back)"})
    comment = comment.strip()
    if len(comment) > FEEDBACK_COMMENT_CHARS:
        raise EntryInvalid(
            {"comment": f"has {len(comment)} characters; the limit is {FEEDBACK_COMMENT_CHARS}"}
        )
    if problem := text_problem(comment):
        raise EntryInvalid({"comment": problem})
    if not verdict:
        Feedback.objects.filter(request_key=request_key, user_id=user_id).delete()
        return None
    with transaction.atomic():
        queued = (
            verdict == Feedback.Verdict.DOWN
            and reviewable
            and _review_allowance_left(user_id=user_id, request_key=request_key)
        )
        row, _ = Feedback.objects.update_or_create(
            request_key=request_key,
            defaults={
                "user_id": user_id,
                "verdict": verdict,
                "comment": comment,
                "interface": interface,
                "queued": queued,
            },
        )
    return row


def _review_allowance_left(*, user_id: int | None, request_key) -> bool:
    """Whether `user_id` may queue one more thumbs down now (on the answer `request_key`): their
    queued thumbs down of the last 24 hours are fewer than KB_REVIEW_DOWNVOTES_PER_DAY. Call it in
    the transaction that writes the verdict."""
    mine = Feedback.objects.filter(user_id=user_id, verdict=Feedback.Verdict.DOWN, queued=True)
    if mine.filter(request_key=request_key).exists():
        return True  # queued before: a new comment on it is not another thumbs down
    # One user's thumbs down sent together take turns here until the transaction ends, so each
    # counts the ones before it: a burst cannot all find the allowance unused.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"knowledge.review_allowance:{user_id}"],
        )
    since = timezone.now() - timedelta(days=1)
    used = mine.filter(updated_at__gte=since).count()
    return used < settings.KB_REVIEW_DOWNVOTES_PER_DAY


def hits_review(*, hit_ids: Iterable[int], verdict: str, curator) -> int:
    """A curator's verdict (`right` or `wrong`) on direct answers. It overrules the users' on
    every answer of the same question with the same entry and takes that question out of the review
    queue (knowledge.hits.review_queue, knowledge.calibration.verdicts_per_person). The number
    changed."""
    if verdict not in Hit.Review.values:
        raise EntryInvalid({"review": "must be `right` or `wrong`"})
    return Hit.objects.filter(pk__in=list(hit_ids)).update(
        review=verdict, reviewed_by=curator, reviewed_at=timezone.now()
    )
