"""Direct answers with the real local embedding model on real PostgreSQL + pgvector."""

import pytest

from knowledge.embedding import E5_SMALL, operating_point
from knowledge.models import Entry, PhrasingVector
from knowledge.normalize import normalize
from knowledge.selectors import direct_answer, serving_model
from knowledge.services.entries import entry_create, entry_update
from knowledge.verdict import Match, vector_verdict

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
def test_a_paraphrase_is_a_vector_hit_with_score_runner_up_and_reason(
    kb, vector_point, question, expected
):
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
        ("How do I cancel my membership?", "How do I cancel my subscription?"),  # too close to tell
        ("cancel my subscription plan", "How do I cancel my order?"),
        ("怎么取消订阅呢", "如何取消订单？"),
        ("取消订阅", "如何取消订单？"),
        ("what is the weather today", None),
        ("when are you open on sunday", None),
    ],
)
def test_near_misses_never_hit_the_wrong_entry(kb, vector_point, question, wrong):
    result = direct_answer(question)
    if wrong is None:
        assert not result.hit, result.reason
    else:
        assert not (result.hit and result.entry == kb[wrong]), result.reason


def test_the_words_overrule_the_embedding_when_they_clearly_prefer_the_runner_up(kb):
    # 订阅 and 订单 share a character; an embedding may rank them either way, the words cannot.
    order, subscription = kb["如何取消订单？"], kb["如何取消订阅？"]
    matches = [
        Match(
            entry=order, score=0.97, phrasing=order.question, texts=(order.question, "怎样取消订单")
        ),
        Match(
            entry=subscription,
            score=0.90,
            phrasing=subscription.question,
            texts=(subscription.question,),
        ),
    ]
    verdict = vector_verdict("怎么取消订阅", matches, threshold=0.9, margin=0.05)
    assert not verdict.hit and "words match" in verdict.reason
    # A hair's difference in the words is noise: the embedding's choice stands.
    matches[1].texts, matches[0].lexical, matches[1].lexical = (subscription.question,), None, None
    assert vector_verdict("如何取消订单呀", matches, threshold=0.9, margin=0.05).hit


def test_the_words_check_leaves_a_cross_lingual_match_to_the_vectors(kb):
    # A Chinese question has no words in common with an English-only entry: no words verdict.
    english, chinese = kb["How do I cancel my subscription?"], kb["如何取消订单？"]
    matches = [
        Match(entry=english, score=0.97, phrasing=english.question, texts=(english.question,)),
        Match(entry=chinese, score=0.90, phrasing=chinese.question, texts=(chinese.question,)),
    ]
    verdict = vector_verdict("怎么取消订阅", matches, threshold=0.9, margin=0.05)
    assert verdict.hit and verdict.entry == english, verdict.reason


def test_a_score_below_the_threshold_is_a_miss_that_names_it(kb, vector_point):
    result = direct_answer("tell me about LoRA adapters")
    assert not result.hit
    assert result.entry == kb["What is LoRA?"]
    assert "below the threshold 0.900" in result.reason


def test_the_default_operating_point_is_the_serving_models_calibrated_one(kb):
    model = serving_model()
    assert model.name == E5_SMALL and model.direct_threshold is None
    assert (model.threshold, model.margin) == (
        operating_point(E5_SMALL).threshold,
        operating_point(E5_SMALL).margin,
    )
    # At the default, precision first: the exact and the very close answer, the near misses do not.
    assert direct_answer("怎么取消订单呢").hit
    for question in (
        "How do I cancel my membership?",
        "when are you open on sunday",
        "tell me about LoRA adapters",
    ):
        assert not direct_answer(question).hit, question


def test_a_models_own_operating_point_beats_the_settings(kb, settings):
    settings.KB_DIRECT_THRESHOLD = 0.5
    model = serving_model()
    model.direct_threshold = 0.999
    model.save(update_fields=["direct_threshold"])
    from knowledge.selectors import serving_model_forget

    serving_model_forget()
    result = direct_answer("cancel my subscription plan")
    assert not result.hit and result.threshold == 0.999


def test_the_global_threshold_and_margin_come_from_settings(kb, settings):
    settings.KB_DIRECT_THRESHOLD = 0.99
    assert not direct_answer("cancel my subscription plan").hit
    settings.KB_DIRECT_THRESHOLD = 0.5
    settings.KB_DIRECT_MARGIN = 0.9
    result = direct_answer("cancel my subscription plan")
    assert not result.hit and "too close" in result.reason


def test_a_per_entry_threshold_overrides_the_global_one(kb, vector_point):
    entry = kb["How do I reset my password?"]
    assert direct_answer("I forgot my password").hit
    entry_update(entry=entry, threshold=0.99)
    result = direct_answer("I forgot my password")
    assert not result.hit and result.threshold == 0.99


def test_an_entry_without_a_current_embedding_is_never_a_vector_hit(kb):
    entry_create(question="Do you ship to Iceland?", answer="Yes, twice a week.", embed="none")
    assert direct_answer("Do you ship to Iceland?").hit  # exact match needs no vector
    result = direct_answer("can you deliver to iceland")
    assert not (result.hit and result.entry.question == "Do you ship to Iceland?")


def test_an_edited_entry_stops_serving_its_old_wording_and_answer(kb):
    entry = kb["What are your opening hours?"]
    entry_update(
        entry=entry,
        question="When is the support line open?",
        answer="Every day, 8:00 to 20:00.",
        embed="none",
    )
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


@pytest.mark.parametrize(
    ("entry", "question"),
    [
        ("How do I turn on notifications?", "How do I turn off notifications?"),
        ("How do I enable two-factor login?", "How do I disable two-factor login?"),
    ],
)
def test_the_opposite_action_is_a_near_miss_not_a_direct_answer(vector_point, entry, question):
    """Their vectors are close enough to answer (GPTCache #694: "turn on" answered "turn off")."""
    entry_create(question=entry, answer="Settings → Notifications.", embed="sync")
    verdict = direct_answer(question)
    assert not verdict.hit
    assert verdict.score >= verdict.threshold  # the vector alone would have answered
    assert "a near miss of KB#" in verdict.reason


def test_a_long_prompt_is_embedded_by_its_beginning_and_never_answered_directly(
    kb, vector_point, settings
):
    from knowledge.embedding import embed_query, query_text, spec_of

    prompt = "How can I cancel an order I placed? " + "Here is the whole story of my week. " * 40
    assert len(query_text(prompt)) <= settings.KB_QUERY_EMBED_CHARS and prompt.startswith(
        query_text(prompt)
    )
    assert query_text("short question") == "short question"
    model = serving_model()
    assert embed_query(spec_of(model), prompt) == embed_query(spec_of(model), query_text(prompt))
    verdict = direct_answer(prompt)
    assert not verdict.hit and "KB_DIRECT_MAX_CHARS" in verdict.reason
    assert (
        verdict.entry == kb["How do I cancel my order?"]
    )  # the match is still there, for the context
