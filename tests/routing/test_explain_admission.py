"""The route tester and /api/routing/explain say whether a request would wait now for room at the
chosen target's capacity: the capacity, the slots held and the requests waiting by class (every
process's, from Redis), the asker's class and where it comes from, its deadline, and what happens
past it (the next target, or a 429)."""

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from chat.apikeys import apikey_create, apikey_priority_set
from routing.models import GroupPriority, RoutingRule
from routing.rules import rules_changed
from tests.support.admission import Standing, endpoint_name, forget
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until

pytestmark = pytest.mark.django_db

EXPLAIN = "/api/routing/explain"
TESTER = "/admin/routing/routingrule/tester/"
NOWHERE = "http://127.0.0.1:9/v1"  # nothing is generated: the endpoints are never called


@pytest.fixture
def chain():
    """The default rule: an engine with a capacity of 1, then an external model without one."""
    url = settings.REDIS_URL
    busy = endpoint(endpoint_name("busy"), url=NOWHERE, capacity=1)
    overflow = endpoint(endpoint_name("overflow"), url=NOWHERE, kind="external")
    rule("default", busy, overflow, is_default=True)
    yield busy, overflow
    forget(busy.name, url)


@pytest.fixture
def standing():
    requests = Standing()
    yield requests
    requests.close()


@pytest.fixture
def ops(django_user_model):
    client = APIClient()
    client.force_authenticate(
        django_user_model.objects.create_superuser("ops", password="pw-1234567")
    )
    return client


def explain(client, **fields):
    response = client.post(EXPLAIN, {"text": "hello there", **fields}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_person_asking_beside_a_full_engine_is_told_it_would_wait_and_then_go_on(
    ops, chain, standing, alice, settings
):
    settings.ADMISSION_DEADLINE_API = 120.0
    settings.ADMISSION_RESERVE = 0
    busy, overflow = chain
    standing.enter(busy.name, 1, tenant="integration", priority="api").result(10)
    standing.enter(busy.name, 1, tenant="another", priority="api")

    def waiting_seen():
        body = explain(ops, user="alice")
        return body if body["chain"][0]["admission"]["waiting"]["api"] == 1 else None

    body = wait_until(waiting_seen, timeout=15, step=0.2)
    assert body is not None, "the waiting request was never seen"
    assert body["priority"] == {"class": "interactive", "from": "default", "deadline_seconds": 10.0}
    first, then = body["chain"]
    assert first["endpoint"] == busy.name
    assert first["admission"] == {
        "capacity": 1,
        "held": 1,
        "waiting": {"interactive": 0, "api": 1, "batch": 0},
        "would_wait": True,
        "why": "all 1 slots are held",
        "past_deadline": f"after 10 s without room: the next target, {overflow.name}",
    }
    assert then["endpoint"] == overflow.name and then["admission"] is None


def test_an_engine_with_room_lets_the_request_start_at_once(ops, chain):
    body = explain(ops)
    admission = body["chain"][0]["admission"]
    assert admission["would_wait"] is False and admission["held"] == 0
    assert admission["why"] == "1 of 1 slots free"


def test_an_api_keys_own_class_and_deadline_apply_and_the_last_target_ends_in_a_429(
    ops, alice, settings
):
    settings.ADMISSION_DEADLINE_BATCH = 300.0
    url = settings.REDIS_URL
    only = endpoint(endpoint_name("only"), url=NOWHERE, capacity=4)
    rule("default", only, is_default=True)
    key = apikey_create(user=alice, name="nightly", scopes=["chat"])[0]
    apikey_priority_set(key=key, priority="batch")
    try:
        body = explain(ops, api_key=key.prefix)
    finally:
        forget(only.name, url)
    assert body["priority"] == {"class": "batch", "from": "key", "deadline_seconds": 300.0}
    assert body["chain"][0]["admission"]["past_deadline"] == (
        "after 300 s without room: a 429 rate_limit_exceeded with Retry-After (/v1 and the chat "
        "API), an error frame busy with retry_after on the socket"
    )


def test_a_users_group_sets_the_class_a_better_class_waiting_counts_ahead(
    ops, chain, standing, alice, settings
):
    settings.ADMISSION_DEADLINE_INTERACTIVE = 120.0
    settings.ADMISSION_RESERVE = 0
    busy, _ = chain
    group = Group.objects.create(name="night-jobs")
    alice.groups.add(group)
    GroupPriority.objects.create(group=group, priority="batch")
    key = apikey_create(user=alice, name="laptop", scopes=["chat"])[0]  # no class of its own
    held = standing.enter(busy.name, 1, tenant="someone", priority="api").result(10)
    standing.enter(busy.name, 1, tenant="person", priority="interactive")

    def seen():
        body = explain(ops, api_key=key.prefix)
        return body if body["chain"][0]["admission"]["waiting"]["interactive"] == 1 else None

    body = wait_until(seen, timeout=15, step=0.2)
    assert body is not None
    assert body["priority"]["class"] == "batch" and body["priority"]["from"] == "groups"
    standing.leave(held)  # the interactive request takes the slot given back

    def free():
        admission = explain(ops, api_key=key.prefix)["chain"][0]["admission"]
        return admission if admission["waiting"]["interactive"] == 0 else None

    admission = wait_until(free, timeout=15, step=0.2)
    assert admission is not None and admission["would_wait"] is True
    assert admission["held"] == 1


def test_an_unknown_key_or_another_users_key_is_refused_with_a_400(ops, chain, alice, bob):
    response = ops.post(EXPLAIN, {"text": "x", "api_key": "deadbeef"}, format="json")
    assert response.status_code == 400
    assert "no live API key with this prefix" in str(response.json())
    key = apikey_create(user=alice, name="laptop", scopes=["chat"])[0]
    response = ops.post(EXPLAIN, {"text": "x", "api_key": key.prefix, "user": "bob"}, format="json")
    assert response.status_code == 400
    assert "this key is alice's, not bob's" in str(response.json())


def test_the_route_tester_page_says_whether_the_request_would_wait(
    admin_client, chain, standing, alice, settings
):
    settings.ADMISSION_RESERVE = 0
    busy, overflow = chain
    standing.enter(busy.name, 1, tenant="integration", priority="api").result(10)
    key = apikey_create(user=alice, name="laptop", scopes=["chat"])[0]
    html = admin_client.get(TESTER, {"text": "hello", "api_key": key.prefix}).content.decode()
    assert "Priority class at an endpoint's capacity: <strong>api</strong> (the default)" in html
    assert f"At {busy.name} now: <strong>would wait</strong> (all 1 slots are held)" in html
    assert f"after 30 s without room: the next target, {overflow.name}" in html
    assert "no capacity set: never waits" in html  # the overflow's row

    html = admin_client.get(TESTER, {"text": "hello", "api_key": "nope"}).content.decode()
    assert "There is no live API key with this prefix." in html


def test_a_named_model_goes_on_to_the_rules_other_targets_unless_the_rule_pins_it(ops, chain):
    busy, overflow = chain
    body = explain(ops, model=busy.name)
    assert [c["endpoint"] for c in body["chain"]] == [busy.name, overflow.name]
    assert body["chain"][0]["admission"]["past_deadline"].endswith(
        f"the next target, {overflow.name}"
    )
    RoutingRule.objects.filter(name="default").update(pin_named=True)
    rules_changed()
    body = explain(ops, model=busy.name)
    assert [c["endpoint"] for c in body["chain"]] == [busy.name]
    assert "a 429 rate_limit_exceeded" in body["chain"][0]["admission"]["past_deadline"]


def test_with_redis_unreachable_the_wait_is_unknown_and_the_rest_is_explained(ops, chain, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    body = explain(ops)
    admission = body["chain"][0]["admission"]
    assert admission["would_wait"] is None and admission["held"] is None
    assert admission["why"].startswith("Redis could not be read")
    assert body["decision"]["rule"] == "default"
