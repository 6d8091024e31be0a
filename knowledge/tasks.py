from celery import shared_task

from knowledge.exceptions import EmbeddingError


@shared_task(
    name="knowledge.tasks.entry_embed",
    autoretry_for=(EmbeddingError, ConnectionError),
    retry_backoff=5,
    retry_backoff_max=300,
    max_retries=5,
)
def entry_embed_task(entry_id: int, version: int) -> bool:
    """Embed one entry; a task for a deleted or since-edited entry does nothing."""
    from knowledge.services import entry_embed

    return entry_embed(entry_id=entry_id, version=version)


@shared_task(name="knowledge.tasks.kb_reembed", soft_time_limit=3600, time_limit=3700)
def kb_reembed_task() -> str:
    """Re-embed the whole KB with the configured model, then switch serving to it."""
    from knowledge.services import kb_reembed

    return kb_reembed().name


@shared_task(name="knowledge.tasks.miss_record", autoretry_for=(EmbeddingError,), max_retries=3, retry_backoff=5)
def miss_record_task(question: str, answer: str, best_entry_id: int | None, best_score: float | None) -> int:
    """Record a question the KB missed and a model answered, for the curators' miss list."""
    from knowledge.services import miss_record

    return miss_record(question=question, answer=answer, best_entry_id=best_entry_id, best_score=best_score).pk
