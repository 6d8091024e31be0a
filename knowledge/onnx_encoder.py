"""ONNX Runtime for the local embedding model: the same weights and pipeline, a fraction of the time.

For a short question, PyTorch's eager mode spends most of its time in Python and operator
dispatch around tiny matrices (MiniLM, a 14-token question, one core: about 8 ms). ONNX
Runtime runs the same graph in about a third of that. The graph is exported once from the
loaded sentence-transformers model (transformer, pooling, normalization: whatever its
modules are), cached on disk under a key of the model's files and the library versions,
and checked against PyTorch before it is used: a graph whose vector differs from PyTorch's
is refused, and the caller keeps PyTorch.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from config.filelock import exclusive

log = logging.getLogger(__name__)

OPSET = 17
# Vectors from the graph and from PyTorch must agree this well (cosine); measured: > 0.999999.
AGREEMENT = 0.9999
_PROBES = ("How do I cancel my order?", "如何取消订阅？", "a")


class OnnxEncoder:
    """encode(texts) -> unit vectors, as SentenceTransformer.encode(normalize_embeddings=True)."""

    def __init__(self, model, session):
        self._model = model  # for its preprocessing (tokenizer, truncation), which stays the library's
        self._session = session
        self._inputs = [item.name for item in session.get_inputs()]

    def encode(self, texts: list[str]) -> np.ndarray:
        features = self._model.preprocess(texts)
        feed = {name: features[name].numpy() for name in self._inputs}
        (vectors,) = self._session.run(None, feed)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)


def onnx_encoder(model, model_dir: Path, *, cache_dir: Path, threads: int) -> OnnxEncoder:
    """An ONNX Runtime encoder for a loaded SentenceTransformer; raises RuntimeError if none is safe."""
    import onnxruntime

    path = _export(model, model_dir, cache_dir)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # KB_EMBEDDING_THREADS: two halve one question's latency; one gives the most questions per
    # second when concurrent questions (each in its own thread) already fill the cores.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    from django.conf import settings

    if not settings.KB_EMBEDDING_SPIN:
        # Threads that spin after a call answer the next call sooner, but the spinning takes CPU
        # from the event loop and the engine under concurrent load.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    encoder = OnnxEncoder(model, session)
    expected = model.encode(list(_PROBES), normalize_embeddings=True, show_progress_bar=False)
    agreement = float(np.min(np.sum(expected * encoder.encode(list(_PROBES)), axis=1)))
    if agreement < AGREEMENT:
        raise RuntimeError(f"the ONNX graph {path} disagrees with PyTorch (cosine {agreement:.6f})")
    return encoder


def _export(model, model_dir: Path, cache_dir: Path) -> Path:
    path = cache_dir / f"{_key(model_dir)}.onnx"
    if path.exists():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Processes starting together (daphne, workers, tests) export once; the others wait.
    with exclusive(path.with_suffix(".lock")):
        if path.exists():  # another process exported it while we waited
            return path
        partial = path.with_suffix(f".{os.getpid()}.partial")
        try:
            _write_graph(model, partial)
            partial.replace(path)  # atomic: a reader sees no graph or a whole one
        finally:
            partial.unlink(missing_ok=True)
    log.info("exported the embedding model %s to ONNX: %s", model_dir, path)
    return path


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
        torch.onnx.export(Graph().eval(), tuple(features[name] for name in names), str(path), input_names=names,
                          output_names=["embedding"], dynamic_axes=axes, opset_version=OPSET, dynamo=False)


def _key(model_dir: Path) -> str:
    """Changes when the model's files or the exporting libraries change."""
    import onnx
    import sentence_transformers
    import torch

    digest = hashlib.sha256(f"{torch.__version__} {onnx.__version__} {sentence_transformers.__version__} "
                            f"opset {OPSET}".encode())
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(model_dir)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return f"{model_dir.name}-{digest.hexdigest()[:16]}"
