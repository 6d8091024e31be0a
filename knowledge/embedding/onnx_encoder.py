"""ONNX Runtime for a local sentence-transformers model: the same weights and pipeline, faster.

For a short question, PyTorch's eager mode spends most of its time in Python and operator
dispatch around tiny matrices; ONNX Runtime runs the same graph in a fraction of that (the
docs/benchmarks.md#fig-minilm-onnx). The graph is exported once from the
loaded sentence-transformers model (transformer, pooling, normalization: whatever its
modules are), cached on disk under a key of the model's files and the library versions,
and checked against PyTorch before it is used: a graph whose vector differs from PyTorch's
is refused, and the caller keeps PyTorch.

Two ways in:

- `onnx_encoder(model, ...)`, from a loaded SentenceTransformer: exports the graph (once),
  checks it against PyTorch, and writes beside it the model's tokenizer and a manifest: its
  truncation length, and PyTorch's own vectors for a few probe texts.
- `cached_encoder(model_dir, ...)`, in every process after that: the graph, the tokenizer (the
  Rust `tokenizers` library the model's tokenizer runs on) and ONNX Runtime, checked against
  the manifest's vectors. No PyTorch, transformers or sentence-transformers is imported: in a
  web process they were seconds of start-up, hundreds of MB, and most of the objects a full
  garbage collection walks (docs/benchmarks.md#fig-gc-pauses).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

from core.filelock import exclusive
from knowledge.embedding import graphs

log = logging.getLogger(__name__)

# Vectors from the graph and from PyTorch must agree this well (cosine); the export agrees far
# closer.
AGREEMENT = 0.9999
# Probes for both checks: English, Chinese, one character, and one past the truncation length.
_PROBES = (
    "How do I cancel my order?",
    "如何取消订阅？",
    "a",
    "  Refund policy for a dishwasher " * 120,
)

Features = Callable[[list[str]], dict[str, np.ndarray]]


class OnnxEncoder:
    """encode(texts) -> unit vectors, as SentenceTransformer.encode(normalize_embeddings=True)."""

    def __init__(self, session, features: Features):
        self._session = session
        self._features = features  # texts -> the graph's inputs (token ids, masks) as arrays
        self._inputs = [item.name for item in session.get_inputs()]

    def encode(self, texts: list[str]) -> np.ndarray:
        features = self._features(texts)
        (vectors,) = self._session.run(None, {name: features[name] for name in self._inputs})
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)


class _Tokenizer:
    """What sentence-transformers' Transformer module does to texts before the model, on the
    `tokenizers` library directly: strip, lower-case if the model says so, the tokenizer with
    its special tokens, truncation to the model's length, padding to the batch's longest."""

    def __init__(self, path: Path, *, max_length: int, lower: bool, pad_id: int, pad_token: str):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        self._lower = lower

    @classmethod
    def of(cls, manifest: dict, cache_dir: Path) -> _Tokenizer:
        """The tokenizer an export's manifest describes."""
        return cls(
            cache_dir / manifest["tokenizer"],
            max_length=manifest["max_seq_length"],
            lower=manifest["do_lower_case"],
            pad_id=manifest["pad_id"],
            pad_token=manifest["pad_token"],
        )

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        texts = [text.strip().lower() if self._lower else text.strip() for text in texts]
        encodings = self._tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }


def _agreement(expected: np.ndarray, encoder: OnnxEncoder) -> float:
    return float(np.min(np.sum(expected * encoder.encode(list(_PROBES)), axis=1)))


def cached_encoder(model_dir: Path, *, cache_dir: Path, threads: int) -> OnnxEncoder | None:
    """The encoder of an earlier export of this model, without loading the library; None when
    there is none yet. Raises RuntimeError (or ONNX Runtime's error) for an export that is
    there but unusable: the caller then loads the library, which exports and checks again."""
    graph, _, manifest_path = _files(model_dir, cache_dir)
    if not manifest_path.exists():
        return None
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    encoder = OnnxEncoder(graphs.session(graph, threads), _Tokenizer.of(manifest, cache_dir))
    expected = np.array([manifest["probes"][text] for text in _PROBES], dtype=np.float32)
    agreement = _agreement(expected, encoder)
    if agreement < AGREEMENT:
        raise RuntimeError(
            f"the cached graph {graph} disagrees with PyTorch's vectors (cosine {agreement:.6f})"
        )
    return encoder


def onnx_encoder(model, model_dir: Path, *, cache_dir: Path, threads: int) -> OnnxEncoder:
    """An ONNX Runtime encoder for a loaded SentenceTransformer; raises RuntimeError if none is
    safe.

    Also writes what `cached_encoder` needs, once its tokenizer is checked too."""
    path, tokenizer_path, manifest_path = _files(model_dir, cache_dir)
    _export(model, path)
    session = graphs.session(path, threads)
    names = [item.name for item in session.get_inputs()]
    encoder = OnnxEncoder(
        session,
        lambda texts: {
            name: value.numpy() for name, value in model.preprocess(texts).items() if name in names
        },
    )
    expected = model.encode(list(_PROBES), normalize_embeddings=True, show_progress_bar=False)
    agreement = _agreement(expected, encoder)
    if agreement < AGREEMENT:
        raise RuntimeError(f"the ONNX graph {path} disagrees with PyTorch (cosine {agreement:.6f})")
    try:
        _write_manifest(model, session, expected, tokenizer_path, manifest_path)
    except Exception as exc:  # noqa: BLE001 - the library's tokenizer serves this process either way
        log.warning(
            "embedding model %s: every process will load PyTorch to tokenize (%s: %s)",
            model_dir,
            type(exc).__name__,
            exc,
        )
    return encoder


def _files(model_dir: Path, cache_dir: Path) -> tuple[Path, Path, Path]:
    """The export's graph, tokenizer and manifest."""
    key = _key(model_dir)
    return cache_dir / f"{key}.onnx", cache_dir / f"{key}.tokenizer.json", cache_dir / f"{key}.json"


def _write_manifest(
    model, session, expected: np.ndarray, tokenizer_path: Path, manifest_path: Path
) -> None:
    """The tokenizer and the manifest beside the graph, when the lean tokenizer gives PyTorch's
    vectors on the probes; written atomically, the manifest last (its presence means: usable)."""
    if manifest_path.exists():
        return
    transformer = model[0]
    manifest = {
        "tokenizer": tokenizer_path.name,
        "max_seq_length": int(model.max_seq_length),
        "do_lower_case": bool(getattr(transformer, "do_lower_case", False)),
        "pad_id": int(model.tokenizer.pad_token_id),
        "pad_token": str(model.tokenizer.pad_token),
        "probes": {text: vector.tolist() for text, vector in zip(_PROBES, expected)},
    }
    graphs.atomic_write(tokenizer_path, model.tokenizer.backend_tokenizer.to_str())
    lean = OnnxEncoder(session, _Tokenizer.of(manifest, tokenizer_path.parent))
    agreement = _agreement(expected, lean)
    if agreement < AGREEMENT:
        raise RuntimeError(
            "its tokenizer on `tokenizers` alone disagrees with the library "
            f"(cosine {agreement:.6f})"
        )
    graphs.atomic_write(manifest_path, json.dumps(manifest))


def _export(model, path: Path) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Processes starting together (daphne, workers, tests) export once; the others wait.
    with exclusive(path.with_name(f"{path.name}.lock")):
        if path.exists():  # another process exported it while we waited
            return
        partial = graphs.partial(path)
        try:
            _write_graph(model, partial)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
    log.info("exported the embedding model to ONNX: %s", path)


def _write_graph(model, path: Path) -> None:
    import torch

    features = model.preprocess(["an example question to trace the graph with"])
    names = [name for name, value in features.items() if isinstance(value, torch.Tensor)]

    class Graph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(dict(zip(names, tensors)))["sentence_embedding"]

    axes = {name: {0: "batch", 1: "tokens"} for name in names}
    axes["embedding"] = {0: "batch"}
    with torch.inference_mode():
        # The TorchScript exporter: the dynamo one needs onnxscript and gains nothing here.
        torch.onnx.export(
            Graph().eval(),
            tuple(features[name] for name in names),
            str(path),
            input_names=names,
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=graphs.OPSET,
            dynamo=False,
        )


def _key(model_dir: Path) -> str:
    """Changes when the model's files or the libraries that export and tokenize change. The
    versions come from the installed packages' metadata: reading them imports nothing."""
    versions = " ".join(
        f"{name} {metadata.version(name)}"
        for name in ("torch", "onnx", "sentence-transformers", "transformers", "tokenizers")
    )
    digest = hashlib.sha256(f"{versions} opset {graphs.OPSET}".encode())
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(model_dir)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return f"{model_dir.name}-{digest.hexdigest()[:16]}"
