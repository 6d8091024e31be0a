"""The vectors of the knowledge base: which embedding models need them, and writing them.

The configured model's row and its indexes (`embedding_model_ensure`); a re-embed that lets a new
model serve only once every phrasing and passage has its vector (`kb_reembed`); one entry embedded
after an edit (`entry_embed`), the model run outside the transaction and re-checked under a row
lock, so a slow embedding holds no lock and a stale one writes nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from knowledge.embedding import PASSAGE, EmbeddingSpec, embed_texts, spec_of
from knowledge.models import (
    EmbeddingModel,
    Entry,
    Passage,
    PassageVector,
    Phrasing,
    PhrasingVector,
)


def configured_spec() -> EmbeddingSpec:
    return EmbeddingSpec(
        name=settings.KB_EMBEDDING_MODEL,  # type: ignore[arg-type]  # set for either backend (config.settings.knowledge)
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
            vectors = embed_texts(spec, [_embedding_text(row) for row in rows], PASSAGE)  # type: ignore[arg-type]  # a Phrasing or a Passage
            vector_model.objects.bulk_create(
                [
                    vector_model(**{field: row}, model=model, embedding=vector)  # type: ignore[misc]  # the vector model of owner
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
