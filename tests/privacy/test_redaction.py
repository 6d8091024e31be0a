"""Redaction and its restorer: one placeholder per value, the values put back however the answer
is cut into chunks, and nothing else of the answer changed."""

import pytest

from privacy.redaction import Redaction, for_curators

PHONE, EMAIL, AN_ID = "13812345678", "li.lei@example.com", "11010519491231002X"
TEXT = f"请用 {PHONE} 或 {EMAIL} 联系我；身份证 {AN_ID}，电话还是 {PHONE}"


def test_each_value_has_one_typed_placeholder():
    redaction = Redaction()
    assert redaction.text(TEXT) == (
        "请用 [PHONE_1] 或 [EMAIL_1] 联系我；身份证 [CN_ID_1]，电话还是 [PHONE_1]"
    )
    assert redaction.text(f"another {PHONE}, a new 13987654321") == (
        "another [PHONE_1], a new [PHONE_2]"
    )
    assert redaction.found == {"phone", "email", "cn_id"}
    assert redaction.text(TEXT, keep={"phone", "email", "cn_id"}) == TEXT


def test_messages_are_redacted_in_every_text_and_left_as_they_were():
    redaction = Redaction()
    messages = [
        {"role": "user", "content": [{"type": "text", "text": f"mail {EMAIL}"}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": f'"{PHONE}"'}}],
        },
    ]
    out = redaction.messages(messages)
    assert out[0]["content"][0]["text"] == "mail [EMAIL_1]"
    assert out[1]["tool_calls"][0]["function"]["arguments"] == '"[PHONE_1]"'
    assert messages[0]["content"][0]["text"] == f"mail {EMAIL}"  # the caller's, untouched


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_the_answer_reads_the_values_however_it_is_cut(size):
    redaction = Redaction()
    answer = redaction.text(TEXT) + " [see the docs] [PHONE_9] x["
    restorer = redaction.restorer()
    chunks = [answer[at : at + size] for at in range(0, len(answer), size)]
    out = "".join(restorer.feed(chunk) for chunk in chunks) + restorer.flush()
    assert out == TEXT + " [see the docs] [PHONE_9] x["  # an unknown placeholder stays


def test_a_placeholder_whose_case_the_model_changed_is_restored():
    redaction = Redaction()
    redaction.text(PHONE)
    restorer = redaction.restorer()
    assert restorer.feed("call [Phone_1] now") == f"call {PHONE} now"


def test_curators_read_placeholders_across_the_question_and_its_answer():
    question, answer = for_curators(f"my mail is {EMAIL}", f"We wrote to {EMAIL}.")
    assert (question, answer) == ("my mail is [EMAIL_1]", "We wrote to [EMAIL_1].")
    assert for_curators("no data here", "") == ["no data here", ""]
