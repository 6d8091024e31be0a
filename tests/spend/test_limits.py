"""Spend limits as a client meets them: requests and tokens per minute and per day, and money
budgets, per API key, user and group, counted in the one Redis every process shares. Over a limit:
a 429 with Retry-After and OpenAI's x-ratelimit-* headers on /v1, the same verdict in the DRF
API's and the socket's shapes. Direct answers from the knowledge base cost nothing.

Limits are counted in fixed UTC minutes: a test that needs two requests in one window starts at
the beginning of a minute's last 50 seconds at the latest (`same_minute`).
"""

import asyncio
import time
from decimal import Decimal

import openai
import pytest
from aiohttp import web
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from chat.apikeys import apikey_create
from chat.models import ApiKey
from observability.models import RequestLog
from observability.requestlog import request_flush
from routing.prompt import prompt_tokens
from spend import ledger
from spend.models import Limit
from tests.chat.test_spend_limits import frame_of_type
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until
from tests.support.sockets import socket_for
from tests.support.stub_engine import StubEngine

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = [{"role": "user", "content": "Tell me about the lighthouses of the northern coast"}]
KB_QUESTION = [{"role": "user", "content": "How do I reset my password?"}]


def same_minute(seconds: float = 10) -> None:
    """Wait, if need be, so that the next `seconds` fall in one UTC minute."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def sdk(asgi_server, key):
    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=30)


def ask(asgi_server, key, messages=QUESTION, max_tokens=16):
    return sdk(asgi_server, key).chat.completions.with_raw_response.create(
        model="auto", messages=messages, max_tokens=max_tokens
    )


def refused(asgi_server, key, messages=QUESTION, max_tokens=16) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        ask(asgi_server, key, messages, max_tokens)
    return caught.value


def key_row(raw: str) -> ApiKey:
    return ApiKey.objects.get(prefix=raw.split("_")[1])


def usage_of(raw: str) -> dict:
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/usage").json()


def _floor(amount: float) -> Decimal:
    """A budget (four decimals) at most `amount`."""
    return Decimal(int(amount * 10_000)) / 10_000


def test_a_key_within_its_limits_is_told_what_is_left(asgi_server, alice_key, product):
    Limit.objects.create(
        api_key=key_row(alice_key), requests_per_minute=10, tokens_per_minute=100_000
    )
    same_minute()
    raw = ask(asgi_server, alice_key)
    assert raw.parse().choices[0].message.content
    headers = raw.headers
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    # The reservation: the prompt and the answer's ceiling, 16 tokens.
    assert 100_000 - 16 - 200 < int(headers["x-ratelimit-remaining-tokens"]) < 100_000 - 16
    assert headers["x-ratelimit-reset-tokens"].endswith("s")


def test_the_reservation_settles_to_what_the_engine_used(asgi_server, alice_key, product):
    Limit.objects.create(api_key=key_row(alice_key), tokens_per_minute=100_000)
    same_minute()
    raw = ask(asgi_server, alice_key, max_tokens=200)
    reserved = 100_000 - int(raw.headers["x-ratelimit-remaining-tokens"])
    usage = raw.parse().usage
    assert usage.completion_tokens < 200 < reserved  # the echo answer is short of its ceiling

    def counted():
        limits = usage_of(alice_key)["limits"]
        return limits[0]["used"] if limits else None

    assert wait_until(lambda: counted() == usage.total_tokens, timeout=10), counted()


def test_over_its_tokens_per_minute_a_key_gets_429_and_when_to_come_back(
    asgi_server, alice_key, product
):
    limit = Limit.objects.create(api_key=key_row(alice_key), tokens_per_minute=100_000)
    same_minute(20)
    first = ask(asgi_server, alice_key)
    reserved = 100_000 - int(first.headers["x-ratelimit-remaining-tokens"])
    used = first.parse().usage.total_tokens
    assert wait_until(lambda: usage_of(alice_key)["limits"][0]["used"] == used, timeout=10)
    # One token short of room for the same request again.
    limit.tokens_per_minute = used + reserved - 1
    limit.save()

    error = refused(asgi_server, alice_key)
    assert error.status_code == 429
    assert error.body["code"] == "rate_limit_exceeded"
    assert (
        "API key laptop" in error.body["message"] and "tokens per minute" in error.body["message"]
    )
    headers = error.response.headers
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert headers["x-ratelimit-limit-tokens"] == str(used + reserved - 1)
    assert headers["x-ratelimit-remaining-tokens"] == str(reserved - 1)
    # Nothing was counted for the refused request.
    assert usage_of(alice_key)["limits"][0]["used"] == used


def test_direct_answers_cost_nothing_and_count_against_nothing(asgi_server, alice_key, product):
    Limit.objects.create(api_key=key_row(alice_key), requests_per_minute=1, tokens_per_minute=1)
    same_minute()
    for _ in range(3):
        raw = ask(asgi_server, alice_key, KB_QUESTION)
        assert raw.headers["X-Route"] == "kb"
        assert "x-ratelimit-remaining-requests" not in raw.headers
    assert [limit["used"] for limit in usage_of(alice_key)["limits"]] == [0, 0]
    # A question for a model could never fit one token: refused, and waiting would not help.
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and "Retry-After" not in error.response.headers
    assert "alone needs about" in error.body["message"]


def test_a_groups_limit_is_shared_by_its_members_and_a_users_holds_beside_the_keys(
    asgi_server, alice, bob, product
):
    support = Group.objects.create(name="support")
    support.user_set.add(alice, bob)
    Limit.objects.create(group=support, requests_per_minute=1)
    alice_raw = apikey_create(user=alice, name="alice-ci", scopes=["chat"])[1]
    bob_raw = apikey_create(user=bob, name="bob-ci", scopes=["chat"])[1]
    # Bob's key has a generous limit of its own: the group's still holds (LiteLLM #11962).
    Limit.objects.create(api_key=key_row(bob_raw), requests_per_minute=100)
    same_minute()
    assert ask(asgi_server, alice_raw).parse().choices[0].message.content
    error = refused(asgi_server, bob_raw)
    assert error.status_code == 429 and "group support" in error.body["message"]
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_the_drf_api_and_the_socket_give_the_same_verdict_in_their_shapes(alice, product):
    Limit.objects.create(user=alice, requests_per_minute=1)
    same_minute()
    api = APIClient()
    api.force_authenticate(alice)
    session = api.post("/api/chat/sessions/", {"title": "limits"}, format="json").json()["id"]
    url = f"/api/chat/sessions/{session}/messages/"
    assert api.post(url, {"content": QUESTION[0]["content"]}, format="json").status_code == 201
    second = api.post(url, {"content": "And the southern one?"}, format="json")
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "limit_exceeded"
    assert "user alice" in second.json()["error"]["message"]
    assert 1 <= int(second["Retry-After"]) <= 60

    async def over_the_socket():
        socket = await socket_for(alice, connect=True)
        await socket.send_json_to({"type": "message", "session": None, "content": "And west?"})
        frame = await frame_of_type(socket, "done", "error")
        await socket.disconnect()
        return frame

    frame = async_to_sync(over_the_socket)()
    assert frame["type"] == "error" and frame["code"] == "limit_exceeded"
    assert 1 <= frame["retry_after"] <= 60 and "user alice" in frame["message"]


def test_each_answer_is_priced_in_the_request_log_and_a_spent_budget_refuses(
    asgi_server, alice_key, product
):
    local = product["local"]
    local.price_input, local.price_output = Decimal("2"), Decimal("10")  # per million tokens
    local.save()
    limit = Limit.objects.create(api_key=key_row(alice_key), budget=Decimal("100"))
    usage = ask(asgi_server, alice_key).parse().usage
    request_flush()
    row = wait_until(lambda: RequestLog.objects.filter(api_key_id=key_row(alice_key).pk).first())
    expected = (usage.prompt_tokens * 2 + usage.completion_tokens * 10) / 1_000_000
    assert row.cost == pytest.approx(expected)
    assert row.prompt_tokens == usage.prompt_tokens
    spend = usage_of(alice_key)["spend"]
    assert spend["today"] == pytest.approx(expected, abs=1e-6)
    assert wait_until(
        lambda: usage_of(alice_key)["limits"][0]["used"] == pytest.approx(expected, abs=1e-6),
        timeout=10,
    )

    limit.budget = _floor(expected)  # at most what was spent: the budget is gone
    limit.save()
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and error.body["code"] == "insufficient_quota"
    assert "budget per month is spent" in error.body["message"]
    assert int(error.response.headers["Retry-After"]) > 0


def test_over_a_budget_that_reroutes_the_over_budget_rules_answer(asgi_server, alice_key, product):
    external = product["external"]
    external.price_input, external.price_output = Decimal("2"), Decimal("10")
    external.save()
    # The default rule is local first; the paid road answers this one.
    rule("paid", external, priority=10, keywords=["lighthouses"], use_kb_context=False)
    limit = Limit.objects.create(
        api_key=key_row(alice_key), budget=Decimal("100"), over_budget="reroute"
    )
    assert ask(asgi_server, alice_key).headers["X-Route-Target"] == "external"
    request_flush()
    assert wait_until(lambda: usage_of(alice_key)["limits"][0]["used"] > 0, timeout=10)

    limit.budget = Decimal("0.000001")
    limit.save()
    # Spent, and no rule for it yet: refused, with no time to wait for.
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and error.body["code"] == "insufficient_quota"
    assert "no over-budget rule" in error.body["message"]

    rule(
        "over budget: local only",
        product["local"],
        priority=1,
        over_budget=True,
        use_kb_context=False,
    )
    raw = ask(asgi_server, alice_key)
    assert raw.headers["X-Route-Target"] == "local"
    assert raw.headers["X-Route-Rule"] == "over budget: local only"
    # Within budget, the over-budget rule takes nobody.
    limit.budget = Decimal("100")
    limit.save()
    assert ask(asgi_server, alice_key).headers["X-Route-Target"] == "external"


def test_a_users_limits_need_no_key_of_theirs_and_usage_shows_only_their_own(alice, bob, product):
    Limit.objects.create(user=alice, tokens_per_day=5000)
    Limit.objects.create(user=bob, requests_per_minute=3)
    api = APIClient()
    api.force_authenticate(alice)
    shown = api.get("/api/usage").json()
    assert [(limit["whose"], limit["limit"], limit["allowed"]) for limit in shown["limits"]] == [
        ("user alice", "tokens per day", 5000)
    ]
    assert shown["spend"]["whose"] == "you"


def test_a_stream_cut_short_settles_to_what_it_produced(asgi_server, alice_key, product):
    Limit.objects.create(api_key=key_row(alice_key), tokens_per_minute=100_000)
    same_minute(20)
    long = [{"role": "user", "content": " ".join(["lighthouse"] * 300)}]  # echoed back, slowly
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="auto", messages=long, max_tokens=400, stream=True
    )
    reserved = 100_000 - int(raw.headers["x-ratelimit-remaining-tokens"])
    stream = raw.parse()
    for _, _chunk in zip(range(5), stream, strict=False):
        pass
    stream.close()  # the client goes: the gateway cancels the engine's request

    def counted():
        used = usage_of(alice_key)["limits"][0]["used"]
        return used if used < reserved else None

    used = wait_until(counted, timeout=10)
    # The prompt and the few tokens that were out, not the 400 reserved for the answer.
    assert used is not None and reserved - 400 < used < reserved - 300, (used, reserved)


def test_a_local_engine_priced_by_its_time_costs_its_seconds_in_the_engine(
    asgi_server, alice_key, product
):
    local = product["local"]
    local.price_engine_second = Decimal("2")
    local.save()
    ask(asgi_server, alice_key, max_tokens=30)
    row = wait_until(lambda: RequestLog.objects.filter(api_key_id=key_row(alice_key).pk).first())
    # The engine's share of the request's time, at 2 a second: more than nothing, less than all.
    assert 0 < row.cost < 2 * row.latency_ms / 1000, (row.cost, row.latency_ms)


def test_a_budget_priced_by_engine_time_reserves_the_time_and_refuses_once_spent(
    asgi_server, alice, alice_key, product
):
    """A bug once: a request to an endpoint priced per engine-second reserved no money (its time is
    known only at its end), and the ledger checks a budget only for an amount above 0: every
    request went through a spent budget."""
    local = product["local"]
    local.price_engine_second = Decimal("1")  # a second of the engine costs 1
    local.save()
    limit = Limit.objects.create(user=alice, budget=Decimal("100"), budget_period="day")
    first = ask(asgi_server, alice_key).parse()
    assert first.choices[0].message.content
    request_flush()
    row = wait_until(lambda: RequestLog.objects.filter(api_key_id=key_row(alice_key).pk).first())
    spent = row.cost
    assert spent > 0
    assert wait_until(
        lambda: usage_of(alice_key)["limits"][0]["used"] == pytest.approx(spent, abs=2e-6),
        timeout=10,
    ), usage_of(alice_key)

    limit.budget = _floor(spent)  # spent
    limit.save()
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and error.body["code"] == "insufficient_quota"
    assert "user alice's budget per day is spent" in error.body["message"]
    assert int(error.response.headers["Retry-After"]) > 0

    # Half a request's time left: the next one may take as long as the first did, and is refused.
    limit.budget = _floor(spent * 1.5)
    limit.save()
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and error.body["code"] == "insufficient_quota"
    assert "may cost up to" in error.body["message"], error.body

    # Spent is spent, whatever the request is priced at: the engine's time free again.
    local.price_engine_second = None
    local.save()
    limit.budget = _floor(spent)
    limit.save()
    error = refused(asgi_server, alice_key)
    assert error.status_code == 429 and "is spent" in error.body["message"]
    assert usage_of(alice_key)["limits"][0]["used"] == pytest.approx(spent, abs=2e-6)


class SilentEngine(StubEngine):
    """Takes each question and answers its headers, then says nothing until the test ends: an
    engine still reading a prompt, or queueing it."""

    def __init__(self):
        super().__init__()
        self._ended: asyncio.Event | None = None

    def _end(self) -> asyncio.Event:
        if self._ended is None:
            self._ended = asyncio.Event()
        return self._ended

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.received.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await self._end().wait()
        return response

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(lambda: self._end().set())
        super().stop()


@pytest.fixture
def silent():
    engine = SilentEngine().start()
    yield engine
    engine.stop()


def test_an_answer_stopped_before_its_first_token_still_counts_its_prompt(alice, silent):
    """A bug once: the meter gave the whole reservation back when nothing was produced, though the
    engine had read the prompt (an external API bills it): stop-every-answer traffic cost
    nothing."""
    held = endpoint(
        "held",
        url=f"{silent.url}/v1",
        model="held",
        first_token_timeout=60,
        price_input=Decimal("1000"),  # per million tokens: 0.001 a prompt token
    )
    rule("default", held, is_default=True, use_kb_context=False, max_tokens=64)
    Limit.objects.create(user=alice, tokens_per_minute=100_000, budget=Decimal("100"))
    same_minute(20)

    async def stopped_at_once():
        socket = await socket_for(alice, connect=True)
        await socket.send_json_to({"type": "message", "session": None, "content": "Stop me"})
        for _ in range(400):  # until the engine has the request (whatever the machine's pace)
            if silent.received:
                break
            await asyncio.sleep(0.05)
        assert silent.received
        await socket.send_json_to({"type": "stop"})
        frame = await frame_of_type(socket, "error")
        await socket.disconnect()
        await ledger.asettled()  # this process's settlements sent, its leases given back
        return frame

    frame = async_to_sync(stopped_at_once)()
    assert frame["code"] == "cancelled"
    prompt = prompt_tokens(silent.received[0]["messages"])
    api = APIClient()
    api.force_authenticate(alice)
    used = {limit["limit"]: limit["used"] for limit in api.get("/api/usage").json()["limits"]}
    # The prompt as the gateway estimates it (the engine reported nothing), and its price; not
    # the 64 tokens reserved for the answer that never came.
    assert used["tokens per minute"] == prompt > 0, used
    assert used["budget per month"] == pytest.approx(prompt * 0.001, abs=2e-6), used
