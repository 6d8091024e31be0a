import time

from celery import shared_task

from knowledge.exceptions import EmbeddingError
from knowledge.miss_groups import misses_group
from knowledge.services.entries import ENTRY_EMBED_TASK
from knowledge.services.vectors import entry_embed, kb_reembed


@shared_task(
    name=ENTRY_EMBED_TASK,
    autoretry_for=(EmbeddingError, ConnectionError),
    retry_backoff=5,
    retry_backoff_max=300,
    max_retries=5,
)
def entry_embed_task(entry_id: int, version: int) -> bool:
    """Embed one entry; a task for a deleted or since-edited entry does nothing."""
    return entry_embed(entry_id=entry_id, version=version)


@shared_task(name="knowledge.tasks.kb_reembed", soft_time_limit=3600, time_limit=3700)
def kb_reembed_task() -> str:
    """Re-embed the whole KB with the configured model, then switch serving to it."""
    return kb_reembed().name


# Below the beat interval, so a slow pass ends before the next one is due. Each pass commits
# on its own: a pass cut short by the limit is rolled back whole and the next run redoes it.
@shared_task(name="knowledge.tasks.misses_group", soft_time_limit=45, time_limit=55)
def misses_group_task(limit: int = 1000, budget: float = 30.0) -> int:
    """Group the KB misses written since the last run (beat); safe to run twice at once."""
    deadline = time.monotonic() + budget
    grouped = 0
    while True:
        placed = misses_group(limit=limit)
        grouped += placed
        # A full pass means more may wait: keep going while the budget lasts.
        if placed < limit or time.monotonic() > deadline:
            return grouped
