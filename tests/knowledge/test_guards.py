"""Which questions read as follow-ups to a conversation, in English and Chinese."""

import pytest

from knowledge.guards import follow_up_marker


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
