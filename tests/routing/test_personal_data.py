"""Personal data stays home: a question holding some never reaches an external endpoint that may
not receive it, as a rule's target or as a fallback, not even while the local engine is down;
a question without any goes where it always went. Real simulators; the external one's own
counter says whether it was sent anything."""

import re

import pytest

from benchmarks import pii_set
from tests.inference_ops.simulator_process import start_simulator
from tests.support.answers import answer_text, ask
from tests.support.factories import endpoint, rule
from tests.support.processes import http_get

pytestmark = pytest.mark.django_db

WITH_AN_ID = "我的身份证号是11010519491231002X，请帮我查一下社保"
WITHOUT = "What is the refund policy for orders over 30 days?"


@pytest.fixture
def outside():
    """The external provider: a simulator of this test's own, so its counter is this test's."""
    sim = start_simulator("serve", "acme/external", "--time-to-first-token", "5")
    yield sim
    sim.stop()


@pytest.fixture
def home():
    """The local engine, this test's own: it may be killed."""
    sim = start_simulator("serve", "acme/local", "--time-to-first-token", "5")
    yield sim
    sim.stop()


def prompts_received(sim) -> float:
    status, body = http_get(f"{sim.url}/metrics")
    assert status == 200
    found = re.search(rb"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", body, re.M)
    assert found, body[:500]
    return float(found.group(1))


def test_a_question_with_personal_data_stays_local_and_one_without_goes_out(home, outside):
    strong = endpoint("strong", outside, kind="external")
    local = endpoint("local", home)
    rule("default", strong, local, is_default=True, use_kb_context=False)

    events = ask(WITH_AN_ID, max_tokens=3)
    assert (events[0].target, events[-1].type) == ("local", "done")
    assert "holds personal data (cn_id)" in events[0].why
    assert "strong: may not receive personal data (cn_id)" in events[0].why
    assert "11010519491231002X" not in events[0].why  # the type, never the value
    assert prompts_received(outside) == 0

    events = ask(WITHOUT, max_tokens=3)
    assert (events[0].target, events[-1].type) == ("strong", "done")
    assert prompts_received(outside) > 0


def test_while_the_local_engine_is_down_no_question_with_findings_leaves(home, outside):
    local = endpoint("local", home)
    spare = endpoint("spare", outside, kind="external")
    rule("default", local, spare, is_default=True, use_kb_context=False)
    home.stop()  # the local engine is killed

    holding = [row["text"] for row in pii_set.read() if row["findings"]][::8]
    assert len(holding) == 40
    for text in holding:
        events = ask(text, max_tokens=3)
        error = events[-1]
        assert error.type == "error" and not answer_text(events), text
        assert "personal data" in error.message, (text, error.message)
    assert prompts_received(outside) == 0

    # The fallback still serves what holds no personal data.
    events = ask(WITHOUT, max_tokens=3)
    assert (events[-1].type, events[-1].target) == ("done", "spare")
    assert prompts_received(outside) > 0


def test_an_external_endpoint_opted_in_for_a_type_receives_that_type_only(home, outside):
    trusted = endpoint("trusted", outside, kind="external", personal_data=["email"])
    local = endpoint("local", home)
    rule("default", trusted, local, is_default=True, use_kb_context=False)

    assert ask("Send the invoice to li.wei@example.com", max_tokens=3)[0].target == "trusted"
    assert ask(f"{WITH_AN_ID}，邮箱li.wei@example.com", max_tokens=3)[0].target == "local"


def test_personal_data_earlier_in_the_conversation_counts_too(home, outside):
    strong = endpoint("strong", outside, kind="external")
    local = endpoint("local", home)
    rule("default", strong, local, is_default=True, use_kb_context=False)
    history = [
        {"role": "user", "content": "My card is 4111 1111 1111 1111"},
        {"role": "assistant", "content": "Thanks, what is the question?"},
    ]
    assert ask("Why was it charged twice?", history=history, max_tokens=3)[0].target == "local"
    assert prompts_received(outside) == 0


def test_with_no_target_that_may_receive_it_the_caller_is_told_why(outside):
    strong = endpoint("strong", outside, kind="external")
    rule("default", strong, is_default=True, use_kb_context=False)
    error = ask(WITH_AN_ID, max_tokens=3)[-1]
    assert (error.type, error.code) == ("error", "personal_data")
    assert "holds personal data (cn_id)" in error.message
    assert "11010519491231002X" not in error.message
    assert prompts_received(outside) == 0


def test_a_named_external_model_gives_way_to_the_local_one_for_personal_data(home, outside):
    strong = endpoint("strong", outside, kind="external")
    local = endpoint("local", home)
    rule("default", strong, local, is_default=True, use_kb_context=False)
    events = ask(WITH_AN_ID, model="strong", max_tokens=3)
    assert (events[0].target, events[-1].type) == ("local", "done")
    assert prompts_received(outside) == 0
