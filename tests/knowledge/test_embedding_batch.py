"""Questions that arrive together are embedded together, and get the vectors they would alone."""

import asyncio
import math

import numpy as np
import pytest
from django.db import connection

from knowledge.embedding import (
    MINILM,
    EmbeddingSpec,
    aembed_query,
    embed_texts,
    query_cache,
    vector_literal,
)
from knowledge.embedding.queries import batcher_for

SPEC = EmbeddingSpec(name=MINILM, backend="local", dimensions=384)
QUESTIONS = [
    "How do I reset my password?",
    "Can I return an item I bought last week?",
    "退款一般几天能到账？",
    "What is continuous batching in LLM inference, and why does it raise throughput so much?",
    "hi",
    "Where is my parcel?",
    "How do I reset my password?",  # the same question twice in one batch
]


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_concurrent_questions_share_model_calls_and_get_their_single_call_vectors():
    alone = {text: embed_texts(SPEC, [text])[0] for text in QUESTIONS}
    query_cache().clear()

    async def together():
        batcher = batcher_for(SPEC)
        vectors = await asyncio.gather(*(aembed_query(SPEC, text) for text in QUESTIONS))
        return vectors, batcher.calls

    vectors, calls = asyncio.run(together())
    assert calls < len(set(QUESTIONS))  # one model call served several questions
    for text, vector in zip(QUESTIONS, vectors):
        # Padding to the batch's longest text changes nothing but float rounding.
        assert len(vector) == 384 and cosine(vector, alone[text]) > 0.99999, text


def test_a_question_seen_before_costs_no_model_call():
    query_cache().clear()

    async def twice():
        batcher = batcher_for(SPEC)
        first = await aembed_query(SPEC, "Do you ship to Norway?")
        calls = batcher.calls
        again = await aembed_query(SPEC, "Do you ship to Norway?")
        return first, again, batcher.calls - calls

    first, again, extra_calls = asyncio.run(twice())
    assert first == again and extra_calls == 0


def test_a_failing_model_call_reaches_every_waiter():
    broken = EmbeddingSpec(name="/no/such/model", backend="local", dimensions=384)

    async def ask():
        return await asyncio.gather(
            *(aembed_query(broken, f"q{i}") for i in range(3)), return_exceptions=True
        )

    results = asyncio.run(ask())
    assert len(results) == 3 and all(
        isinstance(r, Exception) and "neither" in str(r) for r in results
    )


@pytest.mark.django_db
def test_a_vector_reaches_postgresql_as_the_float32_values_the_column_keeps():
    vector = tuple(np.random.default_rng(7).uniform(-1, 1, 384))
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::vector(384)::real[]", [vector_literal(vector)])
        (stored,) = cursor.fetchone()
    assert np.array_equal(np.array(stored, dtype=np.float32), np.array(vector, dtype=np.float32))
