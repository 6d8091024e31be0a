"""/v1 through the official SDK: what the routing rules let a key name, and what an engine asking to
wait tells the client."""

import time

import openai
import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from chat.models import ApiKey
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def intern_key(product, django_user_model):
    """A key of a user in the `interns` group, whose rule allows only the local model."""
    interns = Group.objects.create(name="interns")
    user = django_user_model.objects.create_user("ivy", password="pw-ivy-123456")
    user.groups.add(interns)
    rule("interns", product["local"], priority=1, use_kb_context=False).groups.add(interns)
    return apikey_create(user=user, name="ivy-laptop", scopes=["chat"])[1]


def sdk(asgi_server, key):
    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_key_cannot_name_a_model_its_rule_does_not_list(asgi_server, intern_key, alice_key):
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk(asgi_server, intern_key).chat.completions.create(
            model="external",
            messages=[{"role": "user", "content": "Draft a press release"}],
            max_tokens=3,
        )
    error = info.value.body
    assert info.value.status_code == 403
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_allowed",
        "model",
        "permission_error",
    )
    assert error["message"] == (
        "Rule 'interns' routes this question and does not list 'external'; "
        "it allows: local, or auto."
    )

    allowed = sdk(asgi_server, intern_key).chat.completions.with_raw_response.create(
        model="local", messages=[{"role": "user", "content": "Draft a press release"}], max_tokens=3
    )
    assert (allowed.headers["X-Route"], allowed.headers["X-Route-Rule"]) == ("local", "interns")
    others = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="external",
        messages=[{"role": "user", "content": "Draft a press release"}],
        max_tokens=3,
    )
    assert (others.headers["X-Route"], others.headers["X-Route-Rule"]) == ("external", "default")


def test_the_model_list_shows_what_the_key_may_name(asgi_server, intern_key, alice_key):
    # Besides the chat models, every key may name the knowledge base's embedding model.
    embedder = "kb:multilingual-e5-small"
    assert [m.id for m in sdk(asgi_server, intern_key).models.list()] == [
        "auto",
        "local",
        embedder,
    ]
    assert [m.id for m in sdk(asgi_server, alice_key).models.list()] == [
        "auto",
        "external",
        "local",
        embedder,
    ]


def test_a_key_named_like_a_partners_client_gets_neither_its_rule_nor_its_model(
    asgi_server, product, external_sim, alice, django_user_model, admin_client
):
    """A rule for a partner lists the client name staff gave the partner's key: another user who
    names a key of theirs the same (the keys page lets anyone pick any name) gets the rules every
    key gets, not the partner's, and the partner's key still gets the partner's."""
    premium = endpoint("premium", external_sim, kind="external")
    rule("partner", premium, clients=["client:acme"], priority=1, use_kb_context=False)
    partner = django_user_model.objects.create_user("acme-bot", password="pw-acme-123456")
    partner_key, partner_raw = apikey_create(user=partner, name="acme", scopes=["chat"])
    given = admin_client.post(
        f"/admin/chat/apikey/{partner_key.pk}/change/", {"client_name": "acme"}
    )
    assert given.status_code == 302

    keys_page = APIClient()
    keys_page.force_login(alice)
    created = keys_page.post(
        "/api/keys/",
        {"name": "acme", "scopes": ["chat"], "client_name": "acme"},  # the last one is not hers
        format="json",
    )
    assert created.status_code == 201
    intruder = created.json()["key"]
    assert ApiKey.objects.get(pk=created.json()["id"]).client_name == ""

    embedder = "kb:multilingual-e5-small"
    assert [m.id for m in sdk(asgi_server, intruder).models.list()] == [
        "auto",
        "external",
        "local",
        embedder,
    ]
    assert [m.id for m in sdk(asgi_server, partner_raw).models.list()] == [
        "auto",
        "premium",
        embedder,
    ]
    ask = [{"role": "user", "content": "Draft a press release"}]
    with pytest.raises(openai.PermissionDeniedError) as refused:
        sdk(asgi_server, intruder).chat.completions.create(
            model="premium", messages=ask, max_tokens=3
        )
    assert refused.value.body["code"] == "model_not_allowed"
    theirs = sdk(asgi_server, intruder).chat.completions.with_raw_response.create(
        model="auto", messages=ask, max_tokens=3
    )
    assert theirs.headers["X-Route-Rule"] == "default"
    partners = sdk(asgi_server, partner_raw).chat.completions.with_raw_response.create(
        model="premium", messages=ask, max_tokens=3
    )
    assert (partners.headers["X-Route-Rule"], partners.headers["X-Route-Target"]) == (
        "partner",
        "premium",
    )


def test_an_engine_asking_to_wait_gives_a_503_that_says_how_long(asgi_server, alice_key, product):
    """Every target answers 429 with Retry-After: the client learns when to come back."""
    from inference_ops.models import ModelEndpoint

    ModelEndpoint.objects.update(
        extra_headers={"X-Sim-Fail": "429"}
    )  # the simulators send Retry-After: 1
    from routing.rules import rules_changed

    rules_changed()
    time.sleep(1.1)  # the gateway's processes reread the rules within a second
    with pytest.raises(openai.InternalServerError) as info:
        sdk(asgi_server, alice_key).chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "Tell me about the sea"}],
            max_tokens=3,
        )
    assert info.value.status_code == 503
    assert info.value.response.headers["Retry-After"] == "1"
    assert info.value.body["code"] == "rate_limited"
