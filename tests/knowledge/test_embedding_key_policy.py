"""An embedding model's URL receives every KB text and question with the key its `api_key_env`
names: the same rule as an endpoint's key, and only superusers edit the row."""

import pytest
from django.core.exceptions import ValidationError

from knowledge.embedding import EmbeddingSpec, OpenAIEmbedder
from knowledge.models import EmbeddingModel

pytestmark = pytest.mark.django_db


def test_an_embedding_model_may_not_name_a_gateway_secret_for_its_key():
    row = EmbeddingModel(
        name="remote",
        backend="openai",
        base_url="https://embed.example/v1",
        dimensions=384,
        api_key_env="SECRET_KEY",
    )
    with pytest.raises(ValidationError) as info:
        row.full_clean()
    assert "SECRET_KEY may not hold an endpoint key" in info.value.message_dict["api_key_env"][0]
    row.api_key_env = "GW_KEY_EMBEDDINGS"
    row.full_clean()


def test_a_row_written_before_the_rule_sends_no_secret(monkeypatch, caplog):
    monkeypatch.setenv("DATABASE_URL", "postgresql://gateway:hunter2@db/gateway")
    spec = EmbeddingSpec(
        name="remote",
        backend="openai",
        dimensions=384,
        base_url="https://embed.example/v1",
        api_key_env="DATABASE_URL",
    )
    embedder = OpenAIEmbedder(spec)
    assert embedder._client.api_key == "unused"  # not the database's password
    assert "DATABASE_URL may not hold an endpoint key" in caplog.text
