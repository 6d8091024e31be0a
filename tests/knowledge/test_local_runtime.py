"""The local embedding model on its two runtimes: ONNX Runtime (the default) and PyTorch."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from django.conf import settings as django_settings

from knowledge.embedding import MINILM, EmbeddingSpec, LocalEmbedder

# Each test exports MiniLM from PyTorch into a fresh cache, or embeds with PyTorch itself.
pytestmark = pytest.mark.torch

SPEC = EmbeddingSpec(name=MINILM, backend="local", dimensions=384)
TEXTS = [
    "How do I cancel my order?",
    "cancel my subscription plan",
    "如何取消订阅？",
    "a",
    "a much longer question about the return policy of a dishwasher that I bought last year " * 3,
    "  past the model's 256 tokens, where truncation decides the vector " * 40,
]


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
    # The next embedder finds the export and tokenizes without the library: the same vectors.
    cached = LocalEmbedder(SPEC, runtime="onnx")
    assert np.min(np.sum(np.array(cached.embed(TEXTS)) * reference, axis=1)) > 0.9999


_CHILD = """
import json, sys
import django
django.setup()
from knowledge.embedding import MINILM, EmbeddingSpec, LocalEmbedder
spec = EmbeddingSpec(name=MINILM, backend="local", dimensions=384)
embedder = LocalEmbedder(spec, runtime="onnx")
vectors = embedder.embed(json.loads(sys.argv[1]))
libraries = [
    name for name in ("torch", "transformers", "sentence_transformers") if name in sys.modules
]
print(json.dumps({"runtime": embedder.runtime, "vectors": vectors, "libraries": libraries}))
"""


def _embed_in_a_new_process(cache_dir, texts: list[str]) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "KB_EMBEDDING_CACHE_DIR": str(cache_dir),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(texts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=django_settings.BASE_DIR,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_after_the_export_embeds_without_loading_pytorch(cache_dir):
    reference = np.array(LocalEmbedder(SPEC, runtime="torch").embed(TEXTS))
    LocalEmbedder(SPEC, runtime="onnx").embed(["export it"])
    child = _embed_in_a_new_process(cache_dir, TEXTS)
    assert child["runtime"] == "onnx"
    assert child["libraries"] == []
    assert np.min(np.sum(np.array(child["vectors"]) * reference, axis=1)) > 0.9999


def test_an_export_whose_check_vectors_disagree_is_not_trusted(cache_dir, caplog):
    LocalEmbedder(SPEC, runtime="onnx").embed(["export it"])
    (manifest_path,) = [
        p for p in cache_dir.glob("*.json") if not p.name.endswith(".tokenizer.json")
    ]
    manifest = json.loads(manifest_path.read_text())
    for text, vector in manifest["probes"].items():
        manifest["probes"][text] = [-x for x in vector]  # as if the graph had drifted from PyTorch
    manifest_path.write_text(json.dumps(manifest))
    embedder = LocalEmbedder(SPEC, runtime="onnx")
    with caplog.at_level(logging.WARNING, logger="knowledge.embedding.backends"):
        embedder.embed(["How do I cancel my order?"])
    assert "the cached ONNX export is unusable (RuntimeError: the cached graph" in caplog.text
    assert embedder.runtime == "onnx"  # the library checked the graph itself, against PyTorch


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
    with caplog.at_level(logging.WARNING, logger="knowledge.embedding.backends"):
        (vector,) = embedder.embed(["How do I cancel my order?"])
    assert embedder.runtime == "torch"
    assert "ONNX Runtime unavailable" in caplog.text
    reference = LocalEmbedder(SPEC, runtime="torch").embed(["How do I cancel my order?"])[0]
    assert float(np.dot(vector, reference)) > 0.9999
