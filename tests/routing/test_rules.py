"""Rule conditions, priority, default, canary weights, validation, explain."""

import random
import re
from collections import Counter

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from knowledge.embedding import E5_SMALL, operating_point
from knowledge.services.entries import entry_create
from routing import breaker
from routing.compiled import Context
from routing.exceptions import RuleInvalid
from routing.pipeline import order_targets
from routing.rules import query_vector, snapshot, snapshot_build
from routing.validation import rule_validate
from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def local(local_sim):
    return endpoint("local", local_sim)


def chosen(text, **ctx):
    """The rule production chooses (`Snapshot.choose`, as the pipeline calls it)."""
    matched, _ = async_to_sync(snapshot().choose)(
        Context(text=text, **ctx), lambda: query_vector(text)
    )
    return matched.name if matched else None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Please translate this paragraph into French", "heavy"),
        ("请把这段话翻译成英文", "heavy"),
        ("TRANSLATE: hello", "heavy"),  # case folded
        ("Ｔｒａｎｓｌａｔｅ this", "heavy"),  # full width folded
        ("How do I reset my password?", "default"),
    ],
)
def test_keywords_match_in_chinese_and_english(local, text, expected):
    rule("heavy", local, keywords=["translate", "翻译"], priority=10)
    rule("default", local, is_default=True)
    assert chosen(text) == expected


def test_regex_length_group_client_and_model_conditions(local):
    staff = Group.objects.create(name="staff")
    rule("order-ids", local, regex=r"\bORD-\d{6}\b", priority=1)
    rule("short", local, max_length=12, priority=2)
    rule("long", local, min_length=200, priority=3)
    staff_rule = rule("staff-roadmap", local, priority=4, keywords=["roadmap"])
    staff_rule.groups.add(staff)
    rule("mobile", local, clients=["client:mobile-app"], priority=5)
    rule("forced", local, requested_models=["gpt-4o"], priority=6)
    rule("default", local, is_default=True)

    assert chosen("Where is ORD-123456 now?") == "order-ids"
    assert chosen("Where is ORD-12 now?") == "default"
    assert chosen("hi there") == "short"
    assert chosen("x " * 150) == "long"
    assert (
        chosen("What is on the roadmap for 2027?", groups=frozenset({"staff"})) == "staff-roadmap"
    )
    assert chosen("What is on the roadmap for 2027?", groups=frozenset({"users"})) == "default"
    assert chosen("Tell me something about shipping", client="client:mobile-app") == "mobile"
    assert chosen("Tell me something about shipping", client="api") == "default"
    assert chosen("Tell me something about shipping", client="web") == "default"
    assert chosen("Tell me something about shipping", model="gpt-4o") == "forced"


def test_semantic_intent_matches_by_similarity_to_examples(local):
    entry_create(question="Seed the embedding model", answer="x", embed="sync")
    rule(
        "writing",
        local,
        intent_examples=[
            "Write a detailed essay about the history of printing",
            "Draft a long report on quarterly sales",
        ],
        intent_threshold=operating_point(E5_SMALL).intent,
        priority=10,
    )
    rule("default", local, is_default=True)
    assert chosen("Could you write an essay on the history of the printing press?") == "writing"
    assert chosen("What are your opening hours?") == "default"


def test_all_set_conditions_must_hold(local):
    rule("both", local, keywords=["refund"], max_length=40, priority=1)
    rule("default", local, is_default=True)
    assert chosen("refund please") == "both"
    assert chosen("refund please, I have a very long story to tell about it") == "default"


def test_priority_decides_and_the_default_catches_the_rest(local):
    rule("second", local, keywords=["ship"], priority=20)
    rule("first", local, keywords=["ship"], priority=10)
    rule("default", local, is_default=True, priority=0)  # the default always comes last
    assert chosen("when do you ship?") == "first"
    assert chosen("hello") == "default"


def test_inactive_rules_are_ignored(local):
    rule("off", local, keywords=["ship"], priority=1, active=False)
    rule("default", local, is_default=True)
    assert chosen("when do you ship?") == "default"


def test_canary_weights_split_traffic_between_targets_at_one_position(local_sim, external_sim):
    stable = endpoint("stable", local_sim)
    canary = endpoint("canary", local_sim)
    fallback = endpoint("fallback", external_sim, kind="external")
    rule("default", [(stable, 90), (canary, 10)], fallback, is_default=True)
    compiled = snapshot().rules[0]
    rng = random.Random(1234)
    firsts = Counter(order_targets(compiled, rng)[0].endpoint for _ in range(4000))
    assert 0.87 < firsts["stable"] / 4000 < 0.93
    assert 0.07 < firsts["canary"] / 4000 < 0.13
    # Whatever is drawn first, the other target of the position and then the fallback follow.
    assert [t.endpoint for t in order_targets(compiled, random.Random(1))][-1] == "fallback"


@pytest.mark.parametrize(
    ("fields", "targets", "field"),
    [
        ({"min_length": 50, "max_length": 10}, None, "max_length"),
        ({"max_length": 0}, None, "max_length"),
        ({"regex": "([unclosed"}, None, "regex"),
        ({"keywords": ["  ", "?!"]}, None, "keywords"),
        ({"is_default": True, "keywords": ["x"]}, None, "is_default"),
        ({"action": "generate"}, [], "targets"),
    ],
)
def test_validation_refuses_rules_that_can_never_match(fields, targets, field):
    with pytest.raises(RuleInvalid) as info:
        rule_validate(fields=fields, targets=targets)
    assert field in info.value.errors


def test_validation_refuses_a_chain_with_an_inactive_endpoint(local_sim):
    retired = endpoint("retired", local_sim, active=False)
    with pytest.raises(RuleInvalid, match="inactive endpoint\\(s\\) in the chain: retired"):
        rule_validate(
            fields={"action": "generate"},
            targets=[{"endpoint": retired, "position": 1, "weight": 100}],
        )


def test_the_admin_refuses_an_invalid_rule_with_a_message(admin_client, local_sim):
    retired = endpoint("retired", local_sim, active=False)
    response = admin_client.post(
        "/admin/routing/routingrule/add/",
        {
            "name": "bad",
            "priority": 1,
            "active": "on",
            "action": "generate",
            "intent_threshold": 0.6,
            "context_k": 4,
            "use_kb_context": "on",
            "min_length": 50,
            "max_length": 10,
            "targets-TOTAL_FORMS": 1,
            "targets-INITIAL_FORMS": 0,
            "targets-0-position": 1,
            "targets-0-endpoint": retired.pk,
            "targets-0-weight": 100,
        },
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert "could never match" in html
    from routing.models import RoutingRule

    assert not RoutingRule.objects.exists()


@pytest.mark.parametrize(
    ("clients", "message"),
    [
        (["key:acme"], "a key's name is chosen by its user"),
        (["web", "acme"], 'a client is "web" or "client:NAME"'),
        (["client:"], "the client name must be 1 to 100 characters"),
        (["client: acme"], "must not start or end with spaces"),
    ],
)
def test_a_rule_names_api_keys_only_by_the_client_name_staff_give_them(clients, message):
    with pytest.raises(RuleInvalid) as info:
        rule_validate(fields={"clients": clients})
    assert message in info.value.errors["clients"]
    rule_validate(fields={"clients": ["web", "client:acme", "client:Mobile app 2"]})


def test_the_admin_refuses_a_rule_that_names_a_key_by_its_own_name(admin_client, local_sim):
    local = endpoint("local", local_sim)
    response = admin_client.post(
        "/admin/routing/routingrule/add/",
        {
            "name": "partner",
            "priority": 1,
            "active": "on",
            "action": "generate",
            "intent_threshold": 0.6,
            "context_k": 4,
            "use_kb_context": "on",
            "clients": "key:acme",
            "targets-TOTAL_FORMS": 1,
            "targets-INITIAL_FORMS": 0,
            "targets-0-position": 1,
            "targets-0-endpoint": local.pk,
            "targets-0-weight": 100,
        },
    )
    assert response.status_code == 200
    assert "a key&#x27;s name is chosen by its user, so rules no longer match it" in (
        response.content.decode()
    )
    from routing.models import RoutingRule

    assert not RoutingRule.objects.exists()


def test_a_rule_replays_passages_unless_the_admin_switches_it_off(admin_client, local_sim):
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True)
    form = admin_client.get("/admin/routing/routingrule/add/").content.decode()
    assert re.search(r'<input[^>]*name="replay_passages"[^>]*checked', form), "on by default"
    response = admin_client.post(
        "/admin/routing/routingrule/add/",
        {
            "name": "short-prompts",
            "priority": 1,
            "active": "on",
            "action": "generate",
            "intent_threshold": 0.6,
            "context_k": 4,
            "use_kb_context": "on",
            "keywords": "refund",
            "targets-TOTAL_FORMS": 1,
            "targets-INITIAL_FORMS": 0,
            "targets-0-position": 1,
            "targets-0-endpoint": local.pk,
            "targets-0-weight": 100,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]

    compiled = {r.name: r.replay_passages for r in snapshot_build().rules}
    assert compiled == {"short-prompts": False, "default": True}


def test_a_rule_change_is_seen_by_the_next_request(local_sim, django_capture_on_commit_callbacks):
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=False)
    assert ask("when do you ship?", max_tokens=2)[0].rule == "default"
    with django_capture_on_commit_callbacks(execute=True):
        rule("shipping", local, keywords=["ship"], priority=1, use_kb_context=False)
    assert ask("when do you ship?", max_tokens=2)[0].rule == "shipping"


# --- explain -------------------------------------------------------------------------------------


def test_explain_shows_the_decision_every_rule_the_kb_and_the_chain(local_sim, external_sim):
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("heavy", external, local, keywords=["translate"], priority=10)
    rule("default", local, external, is_default=True)
    entry_create(question="How do I cancel my order?", answer="Orders page.", embed="sync")
    async_to_sync(breaker.failure)("external")

    client = APIClient()
    from django.contrib.auth import get_user_model

    client.force_authenticate(
        get_user_model().objects.create_superuser("ops", password="pw-123456789")
    )
    body = client.post(
        "/api/routing/explain", {"text": "Please translate my order"}, format="json"
    ).json()
    assert body["decision"] == {"road": "external", "rule": "heavy", "reason": "rule heavy"}
    assert [(r["rule"], r["matched"], r["chosen"]) for r in body["rules"]] == [
        ("heavy", True, True),
        ("default", True, False),
    ]
    assert body["rules"][0]["why"] == ["✓ keywords: translate"]
    assert (
        body["kb"]["hit"] is False
        and body["kb"]["matches"][0]["question"] == "How do I cancel my order?"
    )
    assert [(c["position"], c["endpoint"], c["road"]) for c in body["chain"]] == [
        (1, "external", "external"),
        (2, "local", "local"),
    ]
    assert body["chain"][0]["breaker"] == "closed" and body["chain"][0]["breaker_failures"] == 1
    assert body["chain"][1]["health"] == "unknown"

    kb = client.post(
        "/api/routing/explain", {"text": "how do I cancel my order"}, format="json"
    ).json()
    assert kb["decision"]["road"] == "kb" and kb["decision"]["entry_id"]


def test_explain_is_for_staff_and_validates_input(client, django_user_model):
    api = APIClient()
    api.force_authenticate(django_user_model.objects.create_user("u", password="pw-123456789"))
    assert api.post("/api/routing/explain", {"text": "x"}, format="json").status_code == 403
    admin = APIClient()
    admin.force_authenticate(
        django_user_model.objects.create_superuser("a", password="pw-123456789")
    )
    assert admin.post("/api/routing/explain", {}, format="json").status_code == 400
    response = admin.post("/api/routing/explain", {"text": "x", "user": "nobody"}, format="json")
    assert response.status_code == 400 and "no user named" in str(response.json())


def test_the_route_tester_page_renders_the_explanation(admin_client, local_sim):
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True)
    html = admin_client.get(
        "/admin/routing/routingrule/tester/", {"text": "hello", "client": "web"}
    ).content.decode()
    assert "Decision: local (rule default)" in html
    assert "default rule: catches everything" in html
