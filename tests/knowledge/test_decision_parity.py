"""The KB's two decision paths agree (knowledge.selectors): `direct_answer`, the sync one the
admin's and the API's testers and the benchmarks read, and `adirect_answer`, the async one every
chat turn takes. They are written twice (one runs the ORM's cursor, the other core.db's pool and
the micro-batched embedder), so a change to one alone would make the tester say one thing and the
chat do another. The same questions, on the real embedder and PostgreSQL, get the same decision
for the same reason from both."""

import pytest
from asgiref.sync import async_to_sync

from knowledge import typos
from knowledge.selectors import adirect_answer, direct_answer
from knowledge.services.entries import entry_create

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_typo_index():
    typos.index_forget()
    yield
    typos.index_forget()


@pytest.fixture
def entries(kb, vector_point):
    """The shared small KB at the vector road's test operating point, plus an entry whose
    opposite action is a near miss and two worded as follow-ups (English and Chinese)."""
    entry_create(
        question="How do I turn on notifications?", answer="Settings → Notifications.", embed="sync"
    )
    entry_create(question="And how long does that take?", answer="About a week.", embed="sync")
    entry_create(question="那要多久？", answer="大约一周。", embed="sync")
    return kb


# (question, the decision both must reach: hit, method, and words of its reason). The method and
# the reason pin the road each case exercises, so a change of the KB or the operating point that
# moves a case to another road fails here rather than leaving that road without a parity check.
CASES = [
    # exact: the normalized question or an alias
    ("how do I cancel my order", True, "exact", "exact match on the question"),
    ("CANCEL AN ORDER.", True, "exact", "exact match on an alias"),
    ("怎样取消订单！", True, "exact", "exact match on an alias"),
    # a typo of a phrasing
    ("How do I resett my password?", True, "typo", "one character off"),
    ("How do I cancel my subscripton?", True, "typo", "one character off"),
    # a paraphrase the vectors answer
    ("explain LoRA", True, "vector", "over the runner-up"),
    ("I forgot my password", True, "vector", "over the runner-up"),
    ("怎么取消订单呢", True, "vector", "over the runner-up"),
    ("取消订阅", True, "vector", "over the runner-up"),
    # near misses: close vectors, another meaning
    ("How do I turn off notifications?", False, "vector", "a near miss of KB#"),
    ("如何开通订阅？", False, "vector", "a near miss of KB#"),
    ("What is QLoRA fine-tuning?", False, "vector", "is below the threshold"),
    # follow-ups asked on their own (the sync path has no conversation; a turn's conversation is
    # the async path's alone, below)
    ("And how long does that take?", True, "exact", "exact match on the question"),
    ("那要多久？", True, "exact", "exact match on the question"),
    ("and what about QLoRA then?", True, "vector", "over the runner-up"),
    # misses
    ("what is the weather today", False, "vector", "is below the threshold"),
    ("今天天气怎么样", False, "vector", "is below the threshold"),
    ("  ?? ", False, "none", "the question is empty"),
]


def _decision(verdict) -> tuple:
    return (
        verdict.hit,
        verdict.method,
        verdict.reason,
        verdict.entry.pk if verdict.entry else None,
    )


@pytest.mark.parametrize(
    ("question", "hit", "method", "why"), CASES, ids=[case[0] for case in CASES]
)
def test_the_sync_and_the_async_path_reach_the_same_decision_for_the_same_reason(
    entries, question, hit, method, why
):
    sync = direct_answer(question)
    # From a sync test: adirect_answer's statements share the test's transaction.
    asynchronous = async_to_sync(adirect_answer)(question)
    assert (sync.hit, sync.method) == (hit, method) and why in sync.reason, sync.reason
    assert _decision(asynchronous) == _decision(sync)
    if sync.score is not None:
        assert asynchronous.score == pytest.approx(sync.score, abs=1e-6)


@pytest.mark.parametrize(
    "question",
    [
        "And how long does that take?",
        "那要多久？",
        "and what about QLoRA then?",
        "I forgot my password",
    ],
)
def test_in_a_conversation_only_a_follow_up_loses_its_direct_answer(entries, question):
    alone = direct_answer(question)
    in_conversation = async_to_sync(adirect_answer)(question, in_conversation=True)
    assert alone.hit
    if question == "I forgot my password":  # a question of its own: no follow-up marker
        assert _decision(in_conversation) == _decision(alone)
    else:
        assert (in_conversation.hit, in_conversation.method) == (False, "follow_up")
        assert f"KB#{alone.entry.pk} is not answered on its own" in in_conversation.reason
