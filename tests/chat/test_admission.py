"""An endpoint at its capacity, as clients see it: a request that finds no room by its class's
deadline is OpenAI's 429 with Retry-After on /v1 (through the official SDK), an error frame on
the socket, and goes to the rule's next target when it has one.

The answers that fill the capacity are held open by an engine that waits for the test's word
after its first token (no timing); the gateway process and this test process (the socket) share
one Redis, so one capacity."""

import openai
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from observability.models import RequestLog
from tests.chat.test_spend_limits import GatedEngine, frame_of_type, v1_client
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until
from tests.support.sockets import socket_for

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = "0.5"


@pytest.fixture(scope="module")
def gated():
    engine = GatedEngine().start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def short_deadline_gateway(child_env, tmp_path_factory):
    from benchmarks.servers import gateway

    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "ADMISSION_DEADLINE_API": DEADLINE,
        "ADMISSION_DEADLINE_INTERACTIVE": DEADLINE,
    }
    with gateway(env=env, log_path=tmp_path_factory.mktemp("admission") / "daphne.log") as server:
        yield server.url


@pytest.fixture(autouse=True)
async def close_executor_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def short_deadline_here(settings):
    settings.ADMISSION_DEADLINE_INTERACTIVE = float(DEADLINE)


@pytest.fixture
def bob_key(bob):
    from chat.apikeys import apikey_create

    return apikey_create(user=bob, name="bob's", scopes=["chat"])[1]


def held_endpoint(gated, name="held"):
    return endpoint(
        name, url=f"{gated.url}/v1", model="gated", capacity=1, idle_timeout=60, total_timeout=60
    )


async def test_a_request_that_finds_no_room_in_time_is_a_429_with_retry_after_everywhere(
    short_deadline_gateway, short_deadline_here, alice_key, bob, bob_key, gated
):
    held = await sync_to_async(held_endpoint)(gated)
    await sync_to_async(rule)("default", held, is_default=True, use_kb_context=False)
    alice = v1_client(short_deadline_gateway, alice_key)
    first = await alice.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "fills it"}], stream=True
    )
    await anext(aiter(first))  # answering: the endpoint's one place is taken

    bobs = v1_client(short_deadline_gateway, bob_key)
    with pytest.raises(openai.RateLimitError) as refused:
        await bobs.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "no room"}]
        )
    error = refused.value.body
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert "busy" in error["message"]
    assert int(refused.value.response.headers["Retry-After"]) >= 1

    socket = await socket_for(bob, connect=True)
    await socket.send_json_to({"type": "message", "session": None, "content": "no room"})
    frame = await frame_of_type(socket, "error", "token")
    assert frame["type"] == "error" and frame["code"] == "busy" and frame["retry_after"] >= 1
    assert "busy" in frame["message"]
    await socket.disconnect()

    # The place given back, the next request is answered.
    gated.release("fills it")
    [chunk async for chunk in first]
    gated.release("room again")
    again = await bobs.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "room again"}]
    )
    assert again.choices[0].message.content == "held done"
    await alice.close()
    await bobs.close()


async def test_a_request_with_no_room_goes_to_the_rules_next_target(
    short_deadline_gateway, alice_key, bob_key, gated
):
    def rows():
        held = held_endpoint(gated, "held-first")
        overflow = endpoint("overflow", url=f"{gated.url}/v1", model="gated")
        rule("default", held, overflow, is_default=True, use_kb_context=False)

    await sync_to_async(rows)()
    alice = v1_client(short_deadline_gateway, alice_key)
    first = await alice.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "takes the place"}], stream=True
    )
    await anext(aiter(first))

    gated.release("overflows")
    bobs = v1_client(short_deadline_gateway, bob_key)
    raw = await bobs.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "overflows"}]
    )
    assert raw.parse().choices[0].message.content == "held done"
    assert raw.headers["X-Route-Target"] == "overflow"

    # Its log row says how long it waited for the first target before going to the next.
    def logged():
        return RequestLog.objects.filter(target="overflow").values_list("wait_ms", flat=True)

    await sync_to_async(wait_until)(lambda: list(logged()))
    (waited,) = await sync_to_async(list)(logged())
    assert waited >= float(DEADLINE) * 1000

    gated.release("takes the place")
    [chunk async for chunk in first]
    await alice.close()
    await bobs.close()
