"""A model named on /v1 goes through the rules: allowed only where the rule that takes the
question lists it, with that rule's prompt and limits. And the rules' regexes run in RE2."""

import time

import pytest
from asgiref.sync import async_to_sync

from routing.compiled import Context
from routing.exceptions import RuleInvalid
from routing.models import RoutingRule
from routing.rules import rules_changed, snapshot
from routing.validation import rule_validate
from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def roads(local_sim, external_sim):
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, external, is_default=True, priority=1000, use_kb_context=False)
    return local, external


def test_a_group_limited_to_the_local_model_cannot_name_the_external_one(roads):
    local, _ = roads
    interns = rule("interns", local, priority=1, use_kb_context=False)
    interns.groups.create(name="interns")

    (error,) = ask(
        "Summarise this contract for me", model="external", groups=frozenset({"interns"})
    )
    assert error.type == "error" and error.code == "model_not_allowed" and error.rule == "interns"
    assert error.message == (
        "Rule 'interns' routes this question and does not list 'external'; "
        "it allows: local, or auto."
    )

    allowed = ask(
        "Summarise this contract for me", model="local", groups=frozenset({"interns"}), max_tokens=2
    )
    assert allowed[0].road == "local" and allowed[0].rule == "interns"
    others = ask("Summarise this contract for me", model="external", max_tokens=2)
    assert others[0].road == "external" and others[0].rule == "default"


def test_a_client_rule_binds_the_api_key_it_names(roads):
    local, _ = roads
    rule("mobile app", local, clients=["client:mobile"], priority=1, use_kb_context=False)
    assert ask("Hello", model="external", client="client:mobile")[0].code == "model_not_allowed"
    assert ask("Hello", model="external", client="api", max_tokens=2)[0].road == "external"


def test_a_kb_only_rule_cannot_be_bypassed_by_naming_a_model(roads):
    rule("policies", keywords=["refund"], action="kb_only", priority=1)
    (error,) = ask("What is your refund policy?", model="external")
    assert error.code == "model_not_allowed"
    assert "answers this question from the knowledge base only" in error.message


def test_the_requested_models_condition_matches_a_named_model(local_sim, external_sim):
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, is_default=True, use_kb_context=False)
    assert (
        ask("Hello", model="external")[0].code == "model_not_allowed"
    )  # the default lists only local

    rule("api external", external, requested_models=["external"], priority=1, use_kb_context=False)
    rules_changed()  # what the commit would do
    route = ask("Hello", model="external", max_tokens=2)[0]
    assert (route.road, route.rule, route.target) == ("external", "api external", "external")


def test_the_rules_prompt_and_limits_apply_to_a_named_model(local_sim):
    local = endpoint("local", local_sim)
    plain = rule("default", local, is_default=True, use_kb_context=False, max_tokens=3)
    question = "Tell me a long story about the old lighthouses of Brittany"
    short = ask(question, model="local")[-1]
    assert short.type == "done" and short.usage["completion_tokens"] == 3  # the rule's max_tokens

    plain.system_prompt = "You are a pirate. " * 40
    plain.save()
    rules_changed()
    long = ask(question, model="local")[-1]
    assert (
        long.usage["prompt_tokens"] > short.usage["prompt_tokens"] + 100
    )  # the rule's prompt went along


def test_a_target_drained_to_weight_zero_cannot_be_named(local_sim, external_sim):
    local = endpoint("local", local_sim)
    canary = endpoint("canary", external_sim)
    rule("default", [(local, 100), (canary, 0)], is_default=True, use_kb_context=False)
    assert ask("Hello", model="canary")[0].code == "model_not_allowed"


def test_choosing_asks_for_the_vector_only_when_an_intent_rule_could_match(local_sim):
    local = endpoint("local", local_sim)
    rule(
        "writing for the web",
        local,
        intent_examples=["Write a long essay"],
        clients=["web"],
        priority=1,
    )
    rule("default", local, is_default=True)
    snap = snapshot()
    asked = []

    async def vector():
        asked.append(1)
        return None

    chosen, _ = async_to_sync(snap.choose)(Context(text="Write an essay", client="api"), vector)
    assert chosen.name == "default" and asked == []  # the intent rule is for web clients only
    chosen, _ = async_to_sync(snap.choose)(Context(text="Write an essay", client="web"), vector)
    assert chosen.name == "default" and asked == [
        1
    ]  # asked once; no model serving, so no intent match


def test_models_a_caller_may_name_follow_the_rules_that_admit_it(roads):
    local, external = roads
    interns_only = rule("interns", local, priority=1)  # takes every question of an intern
    interns_only.groups.create(name="interns")
    rule("api external", [(external, 100), (local, 100)], requested_models=["external"], priority=2)
    snap = snapshot()
    assert snap.nameable(groups=frozenset({"interns"}), client="api") == ["local"]
    assert snap.nameable(groups=frozenset(), client="api") == ["external", "local"]
    RoutingRule.objects.filter(name="default").update(clients=["web"], is_default=False)
    rules_changed()
    assert snapshot().nameable(groups=frozenset(), client="api") == ["external"]


# --- regular expressions in RE2 ------------------------------------------------------------------


def test_a_catastrophic_pattern_answers_at_once(local_sim):
    """`(\\w+\\s?)+$` took 0.9 s against 22 characters with Python's `re`, ×3.5 per two more;
    against 60 it would run for hours."""
    local = endpoint("local", local_sim)
    rule("backtracker", local, regex=r"(\w+\s?)+$", priority=1)
    rule("default", local, is_default=True)
    started = time.monotonic()
    matched, _ = async_to_sync(snapshot().choose)(Context(text="a" * 60 + "!"), lambda: None)
    assert matched.name == "default"
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"(?<=order )\d+", "invalid perl operator: (?<="),
        (r"(?=x)", "invalid perl operator: (?="),
    ],
)
def test_patterns_re2_cannot_run_are_refused_with_the_reason(pattern, why):
    with pytest.raises(RuleInvalid) as info:
        rule_validate(fields={"regex": pattern})
    message = info.value.errors["regex"]
    assert message.startswith(f"is not a valid RE2 regular expression ({why});")
    assert "\\p{Han}" in message


def test_unicode_classes_match_chinese(local_sim):
    local = endpoint("local", local_sim)
    rule("chinese", local, regex=r"^\p{Han}+[？?]?$", priority=1)
    rule("default", local, is_default=True)
    snap = snapshot()
    assert (
        async_to_sync(snap.choose)(Context(text="订单怎么取消？"), lambda: None)[0].name
        == "chinese"
    )
    assert (
        async_to_sync(snap.choose)(Context(text="How do I cancel?"), lambda: None)[0].name
        == "default"
    )


def test_a_stored_pattern_re2_cannot_run_never_matches_and_says_why(local_sim):
    local = endpoint("local", local_sim)
    rule(
        "old python pattern", local, regex=r"(?<=ORD-)\d+", priority=1
    )  # written before RE2, unvalidated
    rule("default", local, is_default=True)
    snap = snapshot()
    matched, _ = async_to_sync(snap.choose)(Context(text="Where is ORD-123?"), lambda: None)
    assert matched.name == "default"
    broken = snap.rules[0]
    assert broken.evaluate(Context(text="Where is ORD-123?")) == (
        False,
        [
            "✗ regex /(?<=ORD-)\\d+/ is not a valid RE2 regular expression "
            "(invalid perl operator: (?<=); "
            "RE2 has no backreferences or lookaround, and \\w, \\d, \\b are ASCII "
            "(use \\p{L}, \\p{Han}, \\p{N} for other scripts): "
            "the rule never matches until it is fixed"
        ],
    )


def test_a_named_model_that_fails_falls_back_to_the_rest_of_its_rules_chain(
    local_sim, external_sim
):
    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=0)
    external = endpoint("external", external_sim, kind="external")
    rule("default", down, external, is_default=True, use_kb_context=False)
    events = ask("Summarise the plot of Hamlet", model="down", max_tokens=3)
    route, done = events[0], events[-1]
    assert (route.target, done.type, done.target) == ("external", "done", "external")
    assert done.fell_back_from == ("down",) and "fell back after down: server_error" in route.why
    assert "you named" not in route.reason and "as a fallback" in route.reason
    assert done.usage["completion_tokens"] == 3  # the usage of the model that answered


def test_a_named_model_is_tried_first_even_when_it_is_the_rules_fallback(local_sim, external_sim):
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, external, is_default=True, use_kb_context=False)
    route = ask("Hello", model="external", max_tokens=2)[0]
    assert (
        route.target == "external" and "you named" in route.reason and "fell back" not in route.why
    )


def test_a_rule_that_pins_named_requests_gives_them_no_fallback(local_sim, external_sim):
    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=0)
    external = endpoint("external", external_sim, kind="external")
    rule("default", down, external, is_default=True, use_kb_context=False, pin_named=True)
    (error,) = ask("Hello", model="down", max_tokens=2)
    assert error.type == "error" and error.code == "server_error"
    assert error.message == "No target could answer: down: server_error"
    assert ask("Hello", max_tokens=2)[0].target == "external"  # auto still falls back
