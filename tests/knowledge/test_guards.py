"""Which questions read as follow-ups to a conversation, in English and Chinese."""

import pytest

from knowledge.guards import follow_up_marker, near_miss


@pytest.mark.parametrize(("text", "marker"), [
    ("And how long does that take?", "And"),
    ("What about Norway?", "What about"),
    ("How do I reset it?", "it"),
    ("Can I return those as well?", "those"),
    ("那要多久？", "那"),
    ("还有别的付款方式吗", "还有"),
    ("它支持中文吗", "它"),
    ("发票怎么开呢？", "呢"),
    ("这个多少钱", "这个"),
])
def test_a_question_that_points_back_is_a_follow_up(text, marker):
    assert follow_up_marker(text) == marker


@pytest.mark.parametrize("text", [
    "How long does delivery take?",
    "Is there a fee for returns?",  # "there" as in "there is"
    "Can I cancel the order I placed yesterday?",
    "退款一般几天能到账",
    "订单怎么取消？",
    "What is LoRA?",
])
def test_a_question_of_its_own_is_not(text):
    assert follow_up_marker(text) is None


@pytest.mark.parametrize(("question", "phrasing", "why"), [
    ("How do I turn off notifications?", "How do I turn on notifications?", "it asks 'off' where the entry says 'on'"),
    ("How do I disable two-factor login?", "How do I enable two-factor login?", "'disable' where the entry says 'enable'"),
    ("Can I return it before shipping?", "Can I return an item after shipping?", "'before' where the entry says 'after'"),
    ("如何关闭自动续费", "如何开通自动续费", "'关闭' where the entry says '开通'"),
    ("怎么解绑银行卡", "怎么绑定银行卡", "'解绑' where the entry says '绑定'"),
    ("I do not want a refund, just an exchange", "I want a refund", "negated"),
    ("可以不开发票吗", "可以开发票吗", "negated"),
])
def test_an_opposite_or_negated_question_is_a_near_miss(question, phrasing, why):
    assert why in near_miss(question, phrasing)


@pytest.mark.parametrize(("question", "phrasing"), [
    ("How can I cancel an order?", "How do I cancel my order?"),
    ("Turn on notifications", "How do I turn on notifications?"),
    ("什么是LoRA", "什么是 LoRA？"),
    ("Why can't I log in?", "I can't log in"),
])
def test_a_paraphrase_is_no_near_miss(question, phrasing):
    assert near_miss(question, phrasing) is None
