"""Direct answers with the real local embedding model on real PostgreSQL + pgvector."""

import pytest

from knowledge.models import Entry, PhrasingVector
from knowledge.normalize import normalize
from knowledge.selectors import direct_answer
from knowledge.services import entry_create, entry_update

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("how do i cancel my order", "How do I cancel my order?"),
        ("ＨＯＷ ＤＯ Ｉ ＣＡＮＣＥＬ ＭＹ ＯＲＤＥＲ？", "How do I cancel my order?"),
        ("  How   do I cancel, my order!!  ", "How do I cancel my order?"),
        ("如何 取消 订单?", "如何取消订单？"),
        ("如何取消订单", "如何取消订单？"),
        ("Ｗｈａｔ　ｉｓ　ＬｏＲＡ？", "What is LoRA?"),
    ],
)
def test_normalization_folds_case_width_punctuation_and_spaces(typed, stored):
    assert normalize(typed) == normalize(stored)


def test_normalization_keeps_words_that_differ_apart():
    assert normalize("What is LoRA?") != normalize("What is QLoRA?")
    assert normalize("如何取消订单") != normalize("如何取消订阅")


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("how do I cancel my order", "How do I cancel my order?"),
        ("CANCEL AN ORDER.", "How do I cancel my order?"),
        ("如何取消订阅", "如何取消订阅？"),
        ("怎样取消订单！", "如何取消订单？"),
    ],
)
def test_exact_match_on_question_and_aliases_answers_directly(kb, question, expected):
    result = direct_answer(question)
    assert result.hit and result.method == "exact"
    assert result.entry == kb[expected]
    assert result.entry.answer == kb[expected].answer


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("how can I cancel an order I placed", "How do I cancel my order?"),
        ("cancel my subscription plan", "How do I cancel my subscription?"),
        ("I forgot my password", "How do I reset my password?"),
        ("explain LoRA", "What is LoRA?"),
        ("怎么取消订单呢", "如何取消订单？"),
    ],
)
def test_a_paraphrase_is_a_vector_hit_with_score_runner_up_and_reason(kb, question, expected):
    result = direct_answer(question)
    assert result.hit, result.reason
    assert result.method == "vector"
    assert result.entry == kb[expected]
    assert result.score >= result.threshold
    assert result.runner_up is not None and result.runner_up.entry != result.entry
    assert result.margin == pytest.approx(result.score - result.runner_up.score)
    assert "threshold" in result.reason


@pytest.mark.parametrize(
    ("question", "wrong"),
    [
        # Near-miss wordings with another meaning must not be answered by the neighbour.
        ("What is QLoRA fine-tuning?", "What is LoRA?"),
        ("How do I cancel my membership?", "How do I cancel my order?"),
        ("cancel my subscription plan", "How do I cancel my order?"),
        ("怎么取消订阅呢", "如何取消订单？"),
        ("取消订阅", "如何取消订单？"),
        ("what is the weather today", None),
        ("when are you open on sunday", None),
    ],
)
def test_near_misses_never_hit_the_wrong_entry(kb, question, wrong):
    result = direct_answer(question)
    if wrong is None:
        assert not result.hit, result.reason
    else:
        assert not (result.hit and result.entry == kb[wrong]), result.reason


def test_chinese_near_miss_is_refused_because_the_words_disagree(kb):
    # The English MiniLM model cannot tell 订阅 from 订单; the lexical check can.
    result = direct_answer("怎么取消订阅呢")
    assert not result.hit
    assert "words match" in result.reason
    assert result.matches[0].entry == kb["如何取消订单？"]


def test_a_score_below_the_threshold_is_a_miss_that_names_it(kb):
    result = direct_answer("tell me about LoRA adapters")
    assert not result.hit
    assert result.entry == kb["What is LoRA?"]
    assert "below the threshold 0.80" in result.reason


def test_the_global_threshold_and_margin_come_from_settings(kb, settings):
    settings.KB_DIRECT_THRESHOLD = 0.99
    assert not direct_answer("cancel my subscription plan").hit
    settings.KB_DIRECT_THRESHOLD = 0.5
    settings.KB_DIRECT_MARGIN = 0.9
    result = direct_answer("cancel my subscription plan")
    assert not result.hit and "too close" in result.reason


def test_a_per_entry_threshold_overrides_the_global_one(kb):
    entry = kb["How do I reset my password?"]
    assert direct_answer("I forgot my password").hit
    entry_update(entry=entry, threshold=0.95)
    result = direct_answer("I forgot my password")
    assert not result.hit and result.threshold == 0.95


def test_an_entry_without_a_current_embedding_is_never_a_vector_hit(kb):
    entry_create(question="Do you ship to Iceland?", answer="Yes, twice a week.", embed="none")
    assert direct_answer("Do you ship to Iceland?").hit  # exact match needs no vector
    result = direct_answer("can you deliver to iceland")
    assert not (result.hit and result.entry.question == "Do you ship to Iceland?")


def test_an_edited_entry_stops_serving_its_old_wording_and_answer(kb):
    entry = kb["What are your opening hours?"]
    entry_update(entry=entry, question="When is the support line open?", answer="Every day, 8:00 to 20:00.",
                 embed="none")
    assert not direct_answer("What are your opening hours?").hit
    assert not PhrasingVector.objects.filter(phrasing__entry=entry).exists()
    result = direct_answer("when is the support line open")
    assert result.hit and result.entry.answer == "Every day, 8:00 to 20:00."


def test_inactive_entries_and_rules_never_answer_directly(kb):
    entry_update(entry=kb["What is LoRA?"], active=False)
    assert not direct_answer("What is LoRA?").hit
    result = direct_answer("Refund policy")
    assert not result.hit  # a rule is context for generation, never an answer by itself


def test_an_empty_question_is_a_miss():
    assert direct_answer("  ?? ").reason == "the question is empty"


def test_document_and_rule_entries_have_no_phrasings(kb):
    assert not kb["refund"].phrasings.exists()
    assert kb["refund"].passages.count() == 1
    assert kb["refund"].kind == Entry.Kind.RULE


@pytest.mark.parametrize(("entry", "question"), [
    ("How do I turn on notifications?", "How do I turn off notifications?"),
    ("How do I enable two-factor login?", "How do I disable two-factor login?"),
])
def test_the_opposite_action_is_a_near_miss_not_a_direct_answer(entry, question):
    """Their vectors are close enough to answer (GPTCache #694: "turn on" answered "turn off")."""
    entry_create(question=entry, answer="Settings → Notifications.", embed="sync")
    verdict = direct_answer(question)
    assert not verdict.hit
    assert verdict.score >= verdict.threshold  # the vector alone would have answered
    assert "a near miss of KB#" in verdict.reason
