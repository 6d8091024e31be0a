"""The local embedding model on its two runtimes: ONNX Runtime (the default) and PyTorch."""

import logging

import numpy as np
import pytest

from knowledge.embeddings import MINILM, EmbeddingSpec, LocalEmbedder

SPEC = EmbeddingSpec(name=MINILM, backend="local", dimensions=384)
TEXTS = ["How do I cancel my order?", "cancel my subscription plan", "如何取消订阅？", "a",
         "a much longer question about the return policy of a dishwasher that I bought last year " * 3]


@pytest.fixture
def cache_dir(tmp_path, settings):
    settings.KB_EMBEDDING_CACHE_DIR = str(tmp_path / "embeddings")
    return tmp_path / "embeddings"


def test_onnx_runtime_gives_the_vectors_pytorch_gives(cache_dir):
    onnx = LocalEmbedder(SPEC, runtime="onnx")
    torch = LocalEmbedder(SPEC, runtime="torch")
    fast, reference = np.array(onnx.embed(TEXTS)), np.array(torch.embed(TEXTS))
    assert (onnx.runtime, torch.runtime) == ("onnx", "torch")
    assert fast.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(fast * reference, axis=1)) > 0.9999
    # One text alone and the same text in a padded batch agree too (the graph pools with the mask).
    alone = np.array(onnx.embed([TEXTS[3]])[0])
    assert float(alone @ fast[3]) > 0.9999


def test_the_graph_is_exported_once_and_reused_by_the_next_process(cache_dir):
    LocalEmbedder(SPEC, runtime="onnx").embed(["first"])
    (graph,) = cache_dir.glob("*.onnx")
    written = graph.stat().st_mtime_ns
    again = LocalEmbedder(SPEC, runtime="onnx")
    again.embed(["second"])
    assert again.runtime == "onnx"
    assert list(cache_dir.glob("*.onnx")) == [graph] and graph.stat().st_mtime_ns == written
    assert not list(cache_dir.glob("*.partial"))


def test_a_broken_cached_graph_falls_back_to_pytorch_with_a_warning(cache_dir, caplog):
    LocalEmbedder(SPEC, runtime="onnx").embed(["export it"])
    (graph,) = cache_dir.glob("*.onnx")
    graph.write_bytes(b"not an onnx graph")
    embedder = LocalEmbedder(SPEC, runtime="onnx")
    with caplog.at_level(logging.WARNING, logger="knowledge.embeddings"):
        (vector,) = embedder.embed(["How do I cancel my order?"])
    assert embedder.runtime == "torch"
    assert "ONNX Runtime unavailable" in caplog.text
    reference = LocalEmbedder(SPEC, runtime="torch").embed(["How do I cancel my order?"])[0]
    assert float(np.dot(vector, reference)) > 0.9999
