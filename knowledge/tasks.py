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
