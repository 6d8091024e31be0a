"""Which questions read as follow-ups to a conversation, in English and Chinese."""

import pytest

from knowledge.guards import follow_up_marker, near_miss
from knowledge.normalize import lexical_similarity, lexical_terms


@pytest.mark.parametrize(
    ("text", "marker"),
    [
        ("And how long does that take?", "And"),
        ("What about Norway?", "What about"),
        ("How do I reset it?", "it"),
        ("Can I return those as well?", "those"),
        ("那要多久？", "那"),
        ("还有别的付款方式吗", "还有"),
        ("它支持中文吗", "它"),
        ("发票怎么开呢？", "呢"),
        ("这个多少钱", "这个"),
    ],
)
def test_a_question_that_points_back_is_a_follow_up(text, marker):
    assert follow_up_marker(text) == marker


@pytest.mark.parametrize(
    "text",
    [
        "How long does delivery take?",
        "Is there a fee for returns?",  # "there" as in "there is"
        "Can I cancel the order I placed yesterday?",
        "退款一般几天能到账",
        "订单怎么取消？",
        "What is LoRA?",
    ],
)
def test_a_question_of_its_own_is_not(text):
    assert follow_up_marker(text) is None


@pytest.mark.parametrize(
    ("question", "phrasing", "why"),
    [
        (
            "How do I turn off notifications?",
            "How do I turn on notifications?",
            "it asks 'off' where the entry says 'on'",
        ),
        (
            "How do I disable two-factor login?",
            "How do I enable two-factor login?",
            "'disable' where the entry says 'enable'",
        ),
        (
            "Can I return it before shipping?",
            "Can I return an item after shipping?",
            "'before' where the entry says 'after'",
        ),
        ("如何关闭自动续费", "如何开通自动续费", "'关闭' where the entry says '开通'"),
        ("怎么解绑银行卡", "怎么绑定银行卡", "'解绑' where the entry says '绑定'"),
        ("I do not want a refund, just an exchange", "I want a refund", "negates 'refund'"),
        ("可以不开发票吗", "可以开发票吗", "negates '发票'"),
        (
            "I don't want to cancel my subscription, just the order",
            "How do I cancel my subscription?",
            "negates 'cancel'",
        ),
        ("不想取消订阅，只取消订单", "如何取消订阅？", "negates '取消'"),
        # the same verb, another object; another verb, the same object
        ("怎么删除收货地址", "怎么添加收货地址？", "'删除' where the entry says '添加'"),
        (
            "How do I delete an API key?",
            "How do I create an API key?",
            "'delete' where the entry says 'create'",
        ),
        (
            "怎么领优惠券",
            "优惠券怎么领取使用",
            None,
        ),  # both actions in the entry: not told apart here
        # the way back from the entry's action
        (
            "How do I un-cancel an order I cancelled by mistake?",
            "How do I cancel my order?",
            "'un-cancel'",
        ),
        ("How do I recover a deleted account?", "How do I delete my account?", "'recover'"),
        ("取消订阅以后怎么重新订阅", "取消订阅后还能继续使用吗？", "'重新'"),
        ("取消的订单能恢复吗", "取消订单后多久退款？", "'恢复'"),
        # another number
        (
            "部署 70B 模型需要多少显存",
            "部署一个 7B 模型需要多少显存？",
            "names '70b' where the entry says '7b'",
        ),
    ],
)
def test_an_opposite_or_negated_question_is_a_near_miss(question, phrasing, why):
    found = near_miss(question, phrasing)
    assert found is None if why is None else why in found


@pytest.mark.parametrize(
    ("question", "phrasing"),
    [
        ("How can I cancel an order?", "How do I cancel my order?"),
        ("Turn on notifications", "How do I turn on notifications?"),
        ("什么是LoRA", "什么是 LoRA？"),
        ("Why can't I log in?", "I can't log in"),
        # a negation that does not touch what the entry asks
        ("I can't log in because I don't remember my password", "How do I reset my password?"),
        ("衣服尺码不合适，想换大一号", "可以换货吗？"),
        ("推理显存爆了怎么办", "推理时显存不足（OOM）怎么办？"),
        ("我的 API key 不小心传到 GitHub 上了", "API 密钥泄露了怎么办？"),
        # the same number
        ("7B的模型要多少G显存才能跑", "部署一个 7B 模型需要多少显存？"),
    ],
)
def test_a_paraphrase_is_no_near_miss(question, phrasing):
    assert near_miss(question, phrasing) is None


@pytest.mark.parametrize(
    ("question", "right", "wrong"),
    [
        ("我想取消昨天下的订单", "如何取消订单？", "如何取消订阅？"),
        ("订阅怎么退掉", "如何取消订阅？", "如何取消订单？"),
        ("退款多久能到账", "退款多久到账？", "如何退货？"),
        ("东西不想要了怎么退货", "如何退货？", "退款多久到账？"),
        ("发票抬头写错了怎么改", "如何修改发票抬头？", "如何开发票？"),
        ("怎么开电子发票", "如何开发票？", "如何修改发票抬头？"),
        (
            "I want to cancel the order I placed",
            "How do I cancel my order?",
            "How do I cancel my subscription?",
        ),
    ],
)
def test_the_words_tell_confusable_entries_apart_in_chinese_as_in_english(question, right, wrong):
    # Character bigrams: 订单 and 订阅 share 订 but no bigram; 开发票 and 修改发票抬头 share only
    # 发票.
    assert lexical_similarity(question, right) > lexical_similarity(question, wrong)


def test_chinese_terms_are_character_bigrams_and_latin_words_stay_whole():
    assert lexical_terms("如何取消订单？") == {"如何", "何取", "取消", "消订", "订单"}
    assert lexical_terms("LoRA 是什么") == {"lora", "是什", "什么"}
