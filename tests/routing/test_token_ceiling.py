"""A rule's max_tokens (else the gateway's ceiling) caps what a client may ask for: spend stays
the operator's call.

The external simulator generates exactly the max_tokens it is sent, so the answer's usage is what
the engine was asked.
"""

import pytest

from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def paid(external_sim):
    return endpoint("paid", external_sim, kind="external")


def completion_tokens(events):
    done = events[-1]
    assert done.type == "done", done
    return done.usage["completion_tokens"]


def test_a_client_asking_for_more_than_the_rules_max_tokens_gets_the_rules(paid):
    rule("default", paid, is_default=True, use_kb_context=False, max_tokens=5)
    assert completion_tokens(ask("Write me a very long essay", max_tokens=500)) == 5


def test_a_client_asking_for_less_than_the_rules_max_tokens_gets_what_it_asked(paid):
    rule("default", paid, is_default=True, use_kb_context=False, max_tokens=5)
    assert completion_tokens(ask("Write me a short line", max_tokens=3)) == 3


def test_a_client_asking_for_nothing_gets_the_rules_max_tokens(paid):
    rule("default", paid, is_default=True, use_kb_context=False, max_tokens=5)
    assert completion_tokens(ask("Write me something")) == 5


def test_without_a_rule_value_the_gateways_ceiling_caps_and_its_default_applies(paid, settings):
    rule("default", paid, is_default=True, use_kb_context=False)
    settings.ROUTING_MAX_TOKENS_CEILING = 7
    settings.ROUTING_DEFAULT_MAX_TOKENS = 4
    assert completion_tokens(ask("Write me a very long essay", max_tokens=500)) == 7
    assert completion_tokens(ask("Write me something")) == 4
    assert completion_tokens(ask("Write me a line", max_tokens=6)) == 6


def test_a_named_model_is_capped_by_the_rule_that_takes_the_question(paid):
    rule("default", paid, is_default=True, use_kb_context=False, max_tokens=5)
    assert completion_tokens(ask("Write me a very long essay", model="paid", max_tokens=500)) == 5
