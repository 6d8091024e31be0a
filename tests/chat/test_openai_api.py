"""The OpenAI-compatible API through the official SDK, sync and async, against daphne over a real
socket."""

import json
import time
import urllib.error
import urllib.request

import openai
import pytest
from django.conf import settings

from chat.apikeys import apikey_create, apikey_revoke
from chat.models import ChatSession, Message

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "Tell me a long story about the sea and its lighthouses"}]


def sdk(asgi_server, key, **kwargs):
    return openai.OpenAI(
        base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=30, **kwargs
    )


def raw_post(url, body: bytes, key=None, content_type="application/json"):
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_lists_auto_and_the_routable_targets(asgi_server, alice_key, product):
    ids = [m.id for m in sdk(asgi_server, alice_key).models.list()]
    # And the knowledge base's embedding model, for /v1/embeddings.
    assert ids == ["auto", "external", "local", "kb:multilingual-e5-small"]


def test_a_kb_answer_comes_back_as_a_normal_completion(asgi_server, alice_key, product):
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "how do I reset my password?"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Use **Forgot password**."
    assert completion.choices[0].finish_reason == "stop"
    assert (
        raw.headers["X-Route"] == "kb"
        and raw.headers["X-Route-Target"] == f"KB#{product['entry'].pk}"
    )


def test_a_generated_answer_without_streaming(asgi_server, alice_key, product):
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="auto", messages=ASK, max_tokens=5
    )
    completion = raw.parse()
    assert (raw.headers["X-Route"], raw.headers["X-Route-Rule"], raw.headers["X-Route-Target"]) == (
        "local",
        "default",
        "local",
    )
    assert (
        completion.usage.completion_tokens == 5 and completion.choices[0].finish_reason == "length"
    )
    assert completion.choices[0].message.content.strip()


async def test_the_async_sdk_streams_with_usage(asgi_server, alice_key, product):
    client = openai.AsyncOpenAI(
        base_url=f"{asgi_server}/v1", api_key=alice_key, max_retries=0, timeout=30
    )
    stream = await client.chat.completions.create(
        model="auto",
        messages=ASK,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["length"]
    await client.close()


def test_a_named_model_forces_that_target_and_skips_the_kb(asgi_server, alice_key, product):
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="external",
        messages=[{"role": "user", "content": "how do I reset my password?"}],
        max_tokens=3,
    )
    assert raw.headers["X-Route"] == "external" and raw.headers["X-Route-Target"] == "external"


def test_an_api_call_stores_no_chat_session_unless_it_names_one(
    asgi_server, alice_key, alice, product
):
    sdk(asgi_server, alice_key).chat.completions.create(model="auto", messages=ASK, max_tokens=3)
    assert not ChatSession.objects.filter(user=alice).exists() and not Message.objects.exists()


def test_an_api_call_naming_its_session_is_stored_there(asgi_server, alice_key, alice, product):
    session = ChatSession.objects.create(user=alice, title="integration", source="api")
    sdk(asgi_server, alice_key).chat.completions.create(
        model="auto", messages=ASK, max_tokens=3, extra_headers={"X-Session-Id": str(session.pk)}
    )
    user, assistant = Message.objects.filter(session=session).order_by("pk")
    assert (user.role, user.content) == ("user", ASK[0]["content"])
    assert (
        assistant.status == "complete"
        and assistant.completion_tokens == 3
        and assistant.road == "local"
    )


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        ("12x", 400, "invalid_session"),
        ("-1", 400, "invalid_session"),
        ("999999", 404, "session_not_found"),
    ],
)
def test_a_session_header_that_names_no_session_of_the_caller_is_refused(
    asgi_server, alice_key, product, header, status, code
):
    with pytest.raises(openai.APIStatusError) as info:
        sdk(asgi_server, alice_key).chat.completions.create(
            model="auto", messages=ASK, max_tokens=3, extra_headers={"X-Session-Id": header}
        )
    assert info.value.status_code == status and info.value.body["code"] == code
    assert not Message.objects.exists()


def test_another_users_session_is_not_found_and_gets_nothing(asgi_server, alice_key, bob, product):
    theirs = ChatSession.objects.create(user=bob, title="bob's")
    with pytest.raises(openai.NotFoundError):
        sdk(asgi_server, alice_key).chat.completions.create(
            model="auto", messages=ASK, max_tokens=3, extra_headers={"X-Session-Id": str(theirs.pk)}
        )
    assert not Message.objects.filter(session=theirs).exists()


def test_a_keys_last_use_is_recorded_behind_the_answer(asgi_server, alice_key, alice, product):
    from chat.models import ApiKey

    assert ApiKey.objects.get(user=alice).last_used_at is None
    sdk(asgi_server, alice_key).chat.completions.create(model="auto", messages=ASK, max_tokens=3)
    for _ in range(50):  # written after the lookup, without holding the request up
        if ApiKey.objects.get(user=alice).last_used_at is not None:
            break
        time.sleep(0.05)
    assert ApiKey.objects.get(user=alice).last_used_at is not None


def test_a_rule_for_a_group_routes_its_members_api_calls(
    asgi_server, alice_key, alice, django_user_model, product
):
    from django.contrib.auth.models import Group

    from tests.support.factories import rule

    staff = Group.objects.create(name="staff")
    rule("staff-external", product["external"], priority=10, use_kb_context=False).groups.add(staff)
    bob = django_user_model.objects.create_user("bob", password="pw")
    bob.groups.add(staff)
    _, bob_key = apikey_create(user=bob, name="bob", scopes=["chat"])

    def road(key) -> str:
        for _ in range(30):  # the gateway rereads the rules within a second
            raw = sdk(asgi_server, key).chat.completions.with_raw_response.create(
                model="auto", messages=ASK, max_tokens=2
            )
            if raw.headers["X-Route-Rule"] == "staff-external" or key == alice_key:
                return raw.headers["X-Route-Target"]
            time.sleep(0.1)
        return raw.headers["X-Route-Target"]

    assert (
        road(bob_key) == "external"
    )  # the group came with the key; the answer did not wait for the rows
    assert road(alice_key) == "local"


def test_keys_are_required_valid_and_not_revoked(asgi_server, alice, product):
    with pytest.raises(openai.AuthenticationError):
        sdk(asgi_server, "gw_nope_nope").models.list()
    key, raw = apikey_create(user=alice, name="old", scopes=["chat"])
    assert sdk(asgi_server, raw).models.list()
    apikey_revoke(key=key)
    # Each gateway process trusts a key it found for API_KEY_CACHE_SECONDS, no longer.
    deadline = time.monotonic() + settings.API_KEY_CACHE_SECONDS + 3
    while True:
        try:
            sdk(asgi_server, raw).models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "a revoked key still works past API_KEY_CACHE_SECONDS"
        time.sleep(0.2)
    status, body = raw_post(f"{asgi_server}/v1/chat/completions", b"{}")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_a_key_without_the_chat_scope_is_refused(asgi_server, django_user_model, product):
    staff = django_user_model.objects.create_user("curator", password="pw-123456789", is_staff=True)
    raw = apikey_create(user=staff, name="kb-only", scopes=["kb"])[1]
    with pytest.raises(openai.PermissionDeniedError):
        sdk(asgi_server, raw).models.list()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (json.dumps({"model": "auto"}).encode(), 400, "messages"),
        (json.dumps({"messages": ASK}).encode(), 400, "model"),
        (
            json.dumps({"model": "auto", "messages": [{"role": "user", "content": 42}]}).encode(),
            400,
            "messages[0]",
        ),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "user", "content": "   "}]}
            ).encode(),
            400,
            "messages",
        ),
        (
            json.dumps({"model": "auto", "messages": ASK, "max_tokens": -1}).encode(),
            400,
            "max_tokens",
        ),
        (
            json.dumps({"model": "auto", "messages": ASK, "temperature": "hot"}).encode(),
            400,
            "temperature",
        ),
        (json.dumps({"model": "nope", "messages": ASK}).encode(), 404, "model"),
        (
            json.dumps(
                {"model": "auto", "messages": [{"role": "user", "content": "x" * 2_000_000}]}
            ).encode(),
            413,
            None,
        ),
    ],
)
def test_bad_input_gets_an_openai_shaped_4xx(asgi_server, alice_key, product, body, status, param):
    code, payload = raw_post(f"{asgi_server}/v1/chat/completions", body, key=alice_key)
    assert code == status, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["message"]
    if param:
        assert payload["error"]["param"] == param
    assert not Message.objects.exists()  # nothing half-written


def test_the_sdk_raises_its_own_errors_for_4xx(asgi_server, alice_key, product):
    client = sdk(asgi_server, alice_key)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=ASK)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="auto", messages=[])


def rate_count(user) -> int:
    """Questions counted against `user` in the current rate-limit window (in the shared Redis)."""
    from core import redis as core_redis

    keys = list(core_redis.client().scan_iter(f"{settings.REDIS_KEY_PREFIX}:chat:rate:{user.pk}:*"))
    return sum(int(core_redis.client().get(key) or 0) for key in keys)


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([{"role": "user", "content": "reset my\x00 password"}], "messages[0]", "NUL"),
        ([{"role": "user", "content": "reset my \ud800 password"}], "messages[0]", "surrogate"),
        ([{"role": "user", "content": "ring the \x07 bell"}], "messages[0]", "control character"),
        ([{"role": "system", "content": "be\x00 brief"}, *ASK], "messages[0]", "NUL"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\udfff"}, *ASK],
            "messages[1]",
            "surrogate",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b\x00"}],
                }
            ],
            "messages[0]",
            "NUL",
        ),
    ],
)
def test_text_that_cannot_be_stored_is_a_400_that_stores_nothing_and_spends_no_rate_limit(
    asgi_server, alice_key, alice, product, messages, param, words
):
    body = json.dumps(
        {"model": "auto", "messages": messages}
    ).encode()  # ASCII: "\ud800" travels as an escape
    code, payload = raw_post(f"{asgi_server}/v1/chat/completions", body, key=alice_key)
    assert code == 400, payload
    assert payload["error"]["param"] == param and payload["error"]["code"] == "invalid_text"
    assert words in payload["error"]["message"]
    assert not Message.objects.exists() and not ChatSession.objects.exists()
    assert rate_count(alice) == 0
    # Tab, line feed and carriage return are text like any other.
    ok = sdk(asgi_server, alice_key).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "how do I\treset my\r\npassword?"}]
    )
    assert ok.choices[0].message.content


def test_a_named_model_that_fails_is_answered_by_its_fallback_which_the_reply_names(
    asgi_server, alice_key, local_sim, external_sim
):
    from tests.support.factories import endpoint, rule

    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=0)
    external = endpoint("external", external_sim, kind="external")
    rule("default", down, external, is_default=True, use_kb_context=False)
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="down", messages=ASK, max_tokens=3
    )
    completion = raw.parse()
    assert raw.headers["X-Route-Target"] == "external" and completion.model == "external"
    assert completion.usage.completion_tokens == 3 and completion.choices[0].message.content


def test_a_stream_cut_mid_answer_goes_on_in_the_same_stream(asgi_server, alice_key, local_sim):
    from tests.support.factories import endpoint, rule

    cut = endpoint("cut", local_sim, extra_headers={"X-Sim-Fail": "mid-stream;after=3"}, retries=0)
    spare = endpoint("spare", local_sim)  # the echo simulator: the same answer, to its end
    rule("default", cut, spare, is_default=True, use_kb_context=False)
    client = sdk(asgi_server, alice_key)
    whole = client.chat.completions.create(model="spare", messages=ASK, max_tokens=200)
    chunks = list(
        client.chat.completions.create(
            model="auto",
            messages=ASK,
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # nothing repeated, nothing lost
    assert len({c.id for c in chunks}) == 1
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.model_extra["gateway_continued"] == ["spare"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=ASK, max_tokens=200
    )
    assert raw.parse().choices[0].message.content == whole.choices[0].message.content
    assert raw.headers["X-Route-Continued"] == "spare" and raw.headers["X-Route-Target"] == "spare"
