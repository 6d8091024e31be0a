"""The personal-data detector: each type found where its check passes, in English and Chinese,
and not where a number only looks like one (precision first)."""

import pytest

from privacy.detector import (
    BANK_CARD,
    CN_ID,
    EMAIL,
    IBAN,
    IP_ADDRESS,
    PASSPORT,
    PHONE,
    SECRET,
    cn_id_valid,
    detect,
    iban_valid,
    luhn_valid,
    types_in,
)


def found(text, **options):
    return [(f.type, text[f.start : f.end]) for f in detect(text, **options)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("我的身份证号是11010519491231002X，请帮我查一下社保", (CN_ID, "11010519491231002X")),
        ("ID 11010519491231002x on file", (CN_ID, "11010519491231002x")),
        (
            "My card is 4111 1111 1111 1111, can you check the charge?",
            (BANK_CARD, "4111 1111 1111 1111"),
        ),
        ("银行卡6212345678901232被冻结了", (BANK_CARD, "6212345678901232")),
        ("amex 3782-822463-10005 declined", (BANK_CARD, "3782-822463-10005")),
        ("IBAN DE89 3704 0044 0532 0130 00 for the refund", (IBAN, "DE89 3704 0044 0532 0130 00")),
        ("pay GB82WEST12345698765432 today", (IBAN, "GB82WEST12345698765432")),
        ("我的手机13812345678，请回电", (PHONE, "13812345678")),
        ("手机：+86 138 1234 5678", (PHONE, "+86 138 1234 5678")),
        ("call me on +44 20 7946 0958 tomorrow", (PHONE, "+44 20 7946 0958")),
        ("write to jane.doe+gw@example.co.uk please", (EMAIL, "jane.doe+gw@example.co.uk")),
        ("邮箱zhang.san@example.cn谢谢", (EMAIL, "zhang.san@example.cn")),
        ("护照号码 E12345678 过期了", (PASSPORT, "E12345678")),
        ("my passport number is X1234567", (PASSPORT, "X1234567")),
        ("the server at 192.168.1.20 is down", (IP_ADDRESS, "192.168.1.20")),
        ("from 2001:db8:85a3::8a2e:370:7334", (IP_ADDRESS, "2001:db8:85a3::8a2e:370:7334")),
        (
            "my key sk-proj-abcdefghijklmnopqrstuvwxyz123 leaked",
            (SECRET, "sk-proj-abcdefghijklmnopqrstuvwxyz123"),
        ),
        ("token AKIAIOSFODNN7EXAMPLE in the log", (SECRET, "AKIAIOSFODNN7EXAMPLE")),
    ],
)
def test_each_type_is_found_with_its_span(text, expected):
    assert found(text) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "What is the refund policy for orders over 30 days?",
        "退货政策是什么？",
        # A check that fails is no finding: one digit off.
        "ID 110105194912310021",
        "card 4111 1111 1111 1112",
        "IBAN DE89 3704 0044 0532 0130 01",
        # An order or tracking number shaped like a mobile number.
        "订单号 13812345678 什么时候发货",
        "my order 13812345678 has not arrived",
        "运单编号：15912345678",
        # A passport's shape without the word; a version, a time, a price.
        "E12345678",
        "upgrade to version 1.2.3.4",
        "meeting at 10:30:45",
        # This machine, any address, a link-local one: nobody's.
        "the server listens on 127.0.0.1 and 0.0.0.0",
        "from fe80::1ff:fe23:4567:890a",
        "it costs 1,234,567.89 yuan",
        # A long number that fails Luhn, and one digit repeated.
        "reference 1234567890123456",
        "0000 0000 0000 0000",
        # An international-looking number no numbering plan allows.
        "+999 1234 5678",
    ],
)
def test_what_only_looks_like_personal_data_is_not_found(text):
    assert found(text) == []


def test_full_width_digits_are_read_and_the_span_is_the_texts_own():
    text = "我的手机１３８１２３４５６７８"
    assert found(text) == [(PHONE, "１３８１２３４５６７８")]


def test_an_id_that_also_passes_luhn_is_an_id_not_a_card():
    # A valid ID of 18 digits that a card network's prefix and Luhn's sum would take too.
    number = next(
        number
        for serial in range(1000)
        if (number := _with_check(f"62010519900101{serial:03d}")).isdigit()
        and cn_id_valid(number)
        and luhn_valid(number)
    )
    assert found(f"身份证 {number}") == [(CN_ID, number)]
    assert found(f"card {number}", types={BANK_CARD}) == [(BANK_CARD, number)]


def _with_check(first17):
    weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
    return first17 + "10X98765432"[sum(int(d) * w for d, w in zip(first17, weights)) % 11]


def test_several_findings_come_in_order_and_never_overlap():
    text = "Jane, jane@example.com, +44 20 7946 0958, card 5555 5555 5555 4444"
    assert found(text) == [
        (EMAIL, "jane@example.com"),
        (PHONE, "+44 20 7946 0958"),
        (BANK_CARD, "5555 5555 5555 4444"),
    ]


def test_types_and_thresholds_are_the_callers():
    text = "我的手机13812345678，邮箱a@example.com"
    assert found(text, types={EMAIL}) == [(EMAIL, "a@example.com")]
    # A mobile number with its context scores 0.9: a stricter threshold drops it.
    assert found(text, thresholds={PHONE: 0.95}) == [(EMAIL, "a@example.com")]
    assert [f.score for f in detect(text)] == [0.9, 1.0]


def test_the_checks():
    assert cn_id_valid("11010519491231002X")
    assert not cn_id_valid("11010519491331002X")  # month 13
    assert not cn_id_valid("99010519491231002X")  # no such province
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB82 WEST 1234 5698 7654")  # a British IBAN has 22 characters


def test_types_in_agrees_with_detect_and_reads_a_text_once(monkeypatch):
    from privacy import detector

    texts = [
        "我的手机13812345678，邮箱a@example.com",
        "没有数字的中文问题，也没有邮箱",
        "key sk-proj-abcdefghijklmnopqrstuvwxyz123",
        "What is the refund policy?",
    ]
    for text in texts:
        assert types_in(text) == {f.type for f in detect(text)}, text
    calls = []
    monkeypatch.setattr(detector, "detect", lambda text, **kw: calls.append(text) or [])
    types_in(texts[0])  # read before: remembered
    types_in(texts[1])  # nothing any finding could be: never read
    assert calls == []


def test_types_in_remembers_each_policy_apart(monkeypatch):
    """The routing's policy and the curators' defaults alternate request by request: neither
    empties the other's memo, and each answers with its own types and thresholds."""
    from privacy import detector

    text = "Try 13812345678 tomorrow, or mail a@example.com"  # a phone at 0.7, an e-mail
    strict = {"types": {"phone", "email"}, "thresholds": {"phone": 0.8}}
    assert types_in(text, **strict) == {"email"}
    assert types_in(text) == {"email", "phone"}
    calls = []
    monkeypatch.setattr(detector, "detect", lambda text, **kw: calls.append(text) or [])
    assert types_in(text, **strict) == {"email"}
    assert types_in(text) == {"email", "phone"}
    assert calls == []
