"""A web process loads at start-up what its first request would otherwise load inside itself.

config.asgi runs this at import, after Django is set up. Daphne imports the application before
it listens, and the web processes share one listening socket (config.web): a process that is
still warming accepts nothing, so a question goes to a warm process instead of waiting for an
embedding model to load. By the time a process answers /readyz it has warmed, and /readyz says
how (the `warm` check).

Each step is optional. One that fails is logged as a warning naming it, and the first request
that needs it loads it then, as it would without a warm-up.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class StillLoading(TimeoutError):
    pass


# The embedder is the one step without a short timeout of its own: a remote embedding server
# gets the client's timeout and retries, a local model waits for the export another process is
# writing. Past this the process starts without it; the load goes on in the background and the
# first request that needs the model waits for it then, as it would without a warm-up.
EMBEDDER_TIMEOUT = 30.0
# Any question will do: what is loaded is the tokenizer, the graph and the runtime's first run.
_SAMPLE = "How do I reset my password?"


@dataclass
class Report:
    warmed: list[str] = field(default_factory=list)  # "embedder all-MiniLM-L6-v2 (onnx) 3.12s"
    failed: list[str] = field(default_factory=list)  # "embedder: EmbeddingError: …"
    seconds: float = 0.0

    def summary(self) -> str:
        text = f"{', '.join(self.warmed) or 'nothing'} in {self.seconds:.2f}s"
        if self.failed:
            text += f"; not warmed, loads on first use: {'; '.join(self.failed)}"
        return text


_report: Report | None = None


def report() -> Report | None:
    """What this process warmed; None if it has not run here (WEB_WARMUP off, or a process
    that does not serve config.asgi: the test client, a management command)."""
    return _report


def _database() -> str:
    from django.db import connection

    # The first connection opens the process's pool; closing hands it back to the pool, where
    # the first request's thread finds it.
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()
    return "database"


def _cache() -> str:
    from django.core.cache import cache

    # The cache object config.asgi made for every request: its pool's first connection.
    cache.get("warmup")
    return "cache"


def _embedder() -> str:
    from django.db import connection

    from knowledge.embedding import embed_texts, embedder_for, spec_of
    from knowledge.selectors import serving_model

    try:
        model = serving_model()
    finally:
        connection.close()
    if model is None:
        return "embedder (no model serving yet)"
    spec = spec_of(model)
    outcome: list[BaseException | None] = []

    def embed() -> None:
        try:
            embed_texts(spec, [_SAMPLE])
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            outcome.append(exc)
        else:
            outcome.append(None)

    # A thread only to bound the wait: the embedder is kept per process, whichever thread loads it.
    thread = threading.Thread(target=embed, name="warmup-embedder", daemon=True)
    thread.start()
    thread.join(EMBEDDER_TIMEOUT)
    if not outcome:
        raise StillLoading(
            f"still loading after {EMBEDDER_TIMEOUT:.0f}s; it goes on in the background"
        )
    if outcome[0] is not None:
        raise outcome[0]
    runtime = getattr(embedder_for(spec), "runtime", "")
    return f"embedder {spec.name}" + (f" ({runtime})" if runtime else "")


def _rules() -> str:
    from django.db import connection

    from routing.rules import snapshot

    try:
        rules = snapshot().rules
    finally:
        connection.close()
    return f"rules ({len(rules)})"


def _typos() -> str:
    from django.db import connection

    from knowledge import typos

    try:
        phrasings = typos.warm()
    finally:
        connection.close()
    return f"typo index ({phrasings} phrasings)"


def _event_loop() -> str:
    """What the first request would open on the server's event loop: the loop's database pool
    (core.db) and Redis client (core.redis). Only under daphne, whose loop exists (not yet
    running) while it imports the application; the work runs on that loop before it serves."""
    import asyncio
    import sys

    server = sys.modules.get("daphne.server")
    loop = getattr(server, "twisted_loop", None)
    if loop is None or loop.is_running() or loop.is_closed():
        return "event loop (not under daphne: opened on first use)"

    from chat.apikeys import warm_statements as key_statements
    from chat.services import warm_statements as turn_statements
    from knowledge.selectors import warm_statements as kb_statements

    # Each statement with inputs that change and match nothing: the connection learns the tables.
    statements = key_statements() + turn_statements() + kb_statements()

    async def open_all() -> int:
        from core import db
        from core import redis as core_redis

        # Every connection of the pool, each having run the statements: none is cold.
        connections = await asyncio.wait_for(db.pool_prepare(statements), timeout=30)
        await asyncio.wait_for(core_redis.aclient().ping(), timeout=10)
        return connections

    try:
        connections = loop.run_until_complete(open_all())
    finally:
        from django.db import connection

        connection.close()  # serving_model's lookup above, back to the pool
    return f"event loop (database pool of {connections}, {len(statements)} statements each, Redis)"


def _urls() -> str:
    from django.urls import reverse

    # Imports the URLconf (every view, DRF, the schema generator) and builds the reverse map.
    reverse("healthz")
    return "urls"


def _heap() -> str:
    """Move everything loaded so far out of the cyclic garbage collector's sight (gc.freeze).

    A web process holds hundreds of thousands of objects once Django, the embedding runtime and
    the rules are loaded, nearly all of them for its lifetime. Left in the oldest generation,
    every full collection walks them all, and no token of any stream moves meanwhile (the tail of
    the added TTFT; docs/benchmarks.md#fig-gc-pauses). Frozen, a full collection walks only
    what the requests since have made."""
    import gc

    gc.collect()
    gc.freeze()
    return f"heap ({gc.get_freeze_count()} objects frozen)"


# The embedder before the rules: compiling a rule with intent examples embeds them. The heap
# last: it freezes what the steps before it loaded.
STEPS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("database", _database),
    ("cache", _cache),
    ("embedder", _embedder),
    ("rules", _rules),
    ("typos", _typos),
    ("event loop", _event_loop),
    ("urls", _urls),
    ("heap", _heap),
)


def run() -> Report | None:
    """Run every step in this thread (see the module's docstring); None when WEB_WARMUP is off."""
    global _report
    from django.conf import settings

    if not settings.WEB_WARMUP:
        return None
    result = Report()
    started = time.perf_counter()
    still_loading = False
    for name, step in STEPS:
        if name == "rules" and still_loading:
            # It would wait for the same model; the first request builds the rules instead.
            result.failed.append("rules: skipped, the embedder is still loading")
            continue
        step_started = time.perf_counter()
        try:
            done = step()
        except Exception as exc:  # noqa: BLE001 - a step that fails is loaded on first use instead
            still_loading = still_loading or isinstance(exc, StillLoading)
            result.failed.append(f"{name}: {type(exc).__name__}: {exc}")
            log.warning(
                "warm-up of pid %d: %s failed (%s: %s); it loads on first use",
                os.getpid(),
                name,
                type(exc).__name__,
                exc,
            )
            continue
        result.warmed.append(f"{done} {time.perf_counter() - step_started:.2f}s")
    result.seconds = time.perf_counter() - started
    _report = result
    log.info("warm-up of pid %d: %s", os.getpid(), result.summary())
    return result
