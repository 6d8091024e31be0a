"""A question's vector: embedded once, from its first characters, kept in an LRU, and for async
callers embedded together with the questions that arrive at the same time (micro-batches)."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict
from functools import lru_cache

from django.conf import settings

from knowledge.embedding.backends import embed_texts
from knowledge.embedding.spec import EmbeddingSpec


class _QueryCache:
    """LRU of query vectors: the same question asked again costs no model call."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._items: OrderedDict[tuple[EmbeddingSpec, str], tuple[float, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, spec: EmbeddingSpec, text: str) -> tuple[float, ...] | None:
        key = (spec, text)
        with self._lock:
            vector = self._items.get(key)
            if vector is not None:
                self._items.move_to_end(key)
            return vector

    def put(self, spec: EmbeddingSpec, text: str, vector: tuple[float, ...]) -> None:
        with self._lock:
            self._items[(spec, text)] = vector
            if len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, spec: EmbeddingSpec, text: str) -> tuple[float, ...]:
        vector = self.lookup(spec, text)
        if vector is None:
            vector = tuple(embed_texts(spec, [text])[0])
            self.put(spec, text, vector)
        return vector

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@lru_cache(maxsize=1)
def query_cache() -> _QueryCache:
    return _QueryCache(settings.KB_QUERY_CACHE_SIZE)


def query_text(text: str) -> str:
    """What of a question is embedded: its first KB_QUERY_EMBED_CHARS characters, cut at a space
    when one is near. An FAQ question is short and a long prompt's subject comes first, while the
    model's time grows with every token (multilingual-e5-small: about 1 ms of CPU a token here;
    a 4,000-character prompt would cost a second)."""
    limit = settings.KB_QUERY_EMBED_CHARS
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", limit - 40, limit)
    return text[: cut if cut > 0 else limit]


def embed_query(spec: EmbeddingSpec, text: str) -> tuple[float, ...]:
    return query_cache().get(spec, query_text(text))


class _Batcher:
    """Questions that arrive together are embedded together, in one model call off the event loop.

    The first question starts a batch and waits `wait` seconds for company; questions that
    arrive while a batch runs form the next one. One call for many short texts costs little
    more than one for a single text, so under load the model's time per question falls instead
    of questions queueing for the model one by one.
    """

    def __init__(self, spec: EmbeddingSpec, *, wait: float, max_batch: int):
        self.spec = spec
        self.wait = wait
        self.max_batch = max_batch
        self.calls = 0  # model calls made, for tests and benchmarks
        self._waiting: dict[str, list[asyncio.Future]] = {}
        self._running = False
        self._task: asyncio.Task | None = None

    async def embed(self, text: str) -> tuple[float, ...]:
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(text, []).append(future)  # the same text twice: embedded once
        if not self._running:
            self._running = True
            # Kept: the loop holds only a weak reference to a task.
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(self.wait)
            while self._waiting:
                texts = list(self._waiting)[: self.max_batch]
                waiters = {text: self._waiting.pop(text) for text in texts}
                self.calls += 1
                try:
                    vectors = await asyncio.to_thread(embed_texts, self.spec, texts)
                except Exception as exc:  # noqa: BLE001 - every waiter hears the failure
                    for futures in waiters.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                cache = query_cache()
                for text, vector in zip(texts, vectors):
                    vector = tuple(vector)  # type: ignore[assignment]  # a tuple from here on
                    cache.put(self.spec, text, vector)  # type: ignore[arg-type]  # a tuple from here on
                    for future in waiters[text]:
                        if not future.done():
                            future.set_result(vector)
        finally:
            self._running = False


# Futures belong to one event loop: one batcher per (loop, model).
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[EmbeddingSpec, _Batcher]] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(spec: EmbeddingSpec) -> _Batcher:
    per_loop = _batchers.setdefault(asyncio.get_running_loop(), {})
    batcher = per_loop.get(spec)
    if batcher is None:
        batcher = per_loop[spec] = _Batcher(
            spec,
            wait=settings.KB_EMBEDDING_BATCH_WAIT_MS / 1000,
            max_batch=settings.KB_EMBEDDING_BATCH_MAX,
        )
    return batcher


async def aembed_query(spec: EmbeddingSpec, text: str) -> tuple[float, ...]:
    """The question's vector for async callers: from the LRU when seen, else micro-batched with
    the questions embedded at the same time."""
    text = query_text(text)
    vector = query_cache().lookup(spec, text)
    if vector is not None:
        return vector
    return await batcher_for(spec).embed(text)
