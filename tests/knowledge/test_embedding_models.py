"""The openai embedding backend over real HTTP (the simulator serving a pooling model),
and a model change that re-embeds the KB while the old model keeps serving."""

import math

import pytest
from django.core.management import call_command
from django.db import connection

from knowledge.embedding import EmbeddingSpec, embed_texts
from knowledge.exceptions import EmbeddingError
from knowledge.models import EmbeddingModel, PassageVector, Phrasing, PhrasingVector
from knowledge.selectors import direct_answer, serving_model, serving_model_forget
from knowledge.services.vectors import kb_reembed
from tests.inference_ops.simulator_process import start_simulator


@pytest.fixture(scope="module")
def embedding_server():
    sim = start_simulator("serve", "sim/embed-256", "--embedding-dim", "256")
    yield sim
    sim.stop()


def _spec(server, **overrides):
    return EmbeddingSpec(
        **{
            "name": "sim/embed-256",
            "backend": "openai",
            "dimensions": 256,
            "base_url": f"{server.url}/v1",
            **overrides,
        }
    )


def test_the_openai_backend_embeds_over_http(embedding_server):
    vectors = embed_texts(
        _spec(embedding_server), ["cancel my order", "cancel an order", "opening hours"]
    )
    assert [len(v) for v in vectors] == [256, 256, 256]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors)
    similar = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    unrelated = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert similar > unrelated


def test_the_openai_backend_reports_wrong_dimensions_and_a_dead_server(embedding_server):
    with pytest.raises(EmbeddingError, match="returned 256 dimensions, configured 1024"):
        embed_texts(_spec(embedding_server, dimensions=1024), ["x"])
    with pytest.raises(EmbeddingError, match="failed"):
        embed_texts(_spec(embedding_server, base_url="http://127.0.0.1:1/v1"), ["x"])


def _use_model(settings, server):
    settings.KB_EMBEDDING_BACKEND = "openai"
    settings.KB_EMBEDDING_MODEL = "sim/embed-256"
    settings.KB_EMBEDDING_DIMENSIONS = 256
    settings.KB_EMBEDDING_BASE_URL = f"{server.url}/v1"


@pytest.mark.django_db
def test_a_model_change_reembeds_everything_while_the_old_model_keeps_serving(
    kb, embedding_server, settings, vector_point
):
    old = serving_model()
    assert old.name == "multilingual-e5-small" and old.dimensions == 384
    _use_model(settings, embedding_server)

    seen_during_build = []

    def progress(done):
        serving_model_forget()
        result = direct_answer("how can I cancel an order I placed")
        seen_during_build.append((serving_model().name, result.hit))

    new = kb_reembed(batch_size=4, progress=progress)
    assert seen_during_build and all(
        seen == ("multilingual-e5-small", True) for seen in seen_during_build
    )

    serving_model_forget()
    assert new.name == "sim/embed-256" and serving_model() == new
    old.refresh_from_db()
    assert old.state == EmbeddingModel.State.RETIRED
    assert PhrasingVector.objects.filter(model=new).count() == Phrasing.objects.count()
    assert not PassageVector.objects.exclude(model__in=[old, new]).exists()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [f"knowledge_phrasingvector_hnsw_m{new.pk}"],
        )
        assert "vector(256)" in cursor.fetchone()[0]

    assert direct_answer("How do I cancel my order").hit  # exact
    result = direct_answer("how do I cancel my order please")
    assert result.method == "vector" and result.matches[0].entry == kb["How do I cancel my order?"]

    # The next re-embed drops the retired model's vectors.
    kb_reembed()
    assert not PhrasingVector.objects.filter(model=old).exists()


@pytest.mark.django_db
def test_the_reembed_command_reports_the_switch(kb, embedding_server, settings, capsys):
    _use_model(settings, embedding_server)
    call_command("kb_reembed")
    out = capsys.readouterr().out
    assert "serving now: multilingual-e5-small" in out and out.rstrip().endswith(
        "serving: sim/embed-256"
    )
