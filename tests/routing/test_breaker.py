"""The breaker's half-open probes: a failed probe puts the next one a little further off (never a
whole new cool-down), a successful one closes it, so a primary that recovers gets its traffic
back within the longest probe interval."""

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from core import redis as core_redis
from routing import breaker
from tests.inference_ops.simulator_process import start_simulator
from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


def _probe_now(name: str) -> None:
    """What waiting out the probe interval does, without the wait."""
    key = f"{settings.REDIS_KEY_PREFIX}:breaker:{name}"
    core_redis.client().hset(key, "probe_at", repr(time.time() - 0.01))


def test_failed_probes_wait_longer_each_time_up_to_the_cap_and_a_success_closes(settings):
    settings.ROUTING_BREAKER_FAILURES = 2
    settings.ROUTING_BREAKER_PROBE_FIRST = 10
    settings.ROUTING_BREAKER_COOLDOWN = 35
    state, allow, failure = (
        async_to_sync(f) for f in (breaker.state, breaker.allow, breaker.failure)
    )
    failure("flappy")
    failure("flappy")
    opened = state("flappy")
    assert opened.state == "open" and 9 < opened.retry_in <= 10
    assert not allow("flappy")

    waits = []
    for _ in range(3):
        _probe_now("flappy")
        assert state("flappy").state == "half_open"
        assert allow("flappy")  # this request is the probe
        assert not allow("flappy")  # and the only one
        failure("flappy")
        after = state("flappy")
        assert after.state == "open"
        waits.append(after.retry_in)
    # 20, 35 (capped, not 40), 35: never the whole cool-down again from a fresh count.
    assert 19 < waits[0] <= 20 and 34 < waits[1] <= 35 and 34 < waits[2] <= 35

    _probe_now("flappy")
    assert allow("flappy")
    async_to_sync(breaker.success)("flappy")
    assert state("flappy").state == "closed" and allow("flappy")


def test_a_request_under_way_when_the_breaker_opened_does_not_delay_the_probe(settings):
    settings.ROUTING_BREAKER_FAILURES = 1
    settings.ROUTING_BREAKER_PROBE_FIRST = 10
    settings.ROUTING_BREAKER_COOLDOWN = 30
    async_to_sync(breaker.failure)("busy")
    async_to_sync(breaker.failure)("busy")  # no probe was sent: a straggler's failure
    assert 9 < async_to_sync(breaker.state)("busy").retry_in <= 10


@pytest.fixture
def flapping_sim():
    """Down (500s, refused) for its first 2 s, then up for a minute."""
    sim = start_simulator("serve", "acme/local", "--fault", "acme/local=flap;down=2;up=60")
    yield sim
    sim.stop()


def test_traffic_returns_to_a_primary_that_recovers(flapping_sim, external_sim, settings):
    settings.ROUTING_BREAKER_FAILURES = 2
    primary = endpoint("primary", flapping_sim, retries=0)
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", primary, spare, is_default=True, use_kb_context=False)
    targets = [ask("hi", max_tokens=2)[-1].target for _ in range(2)]
    assert targets == ["spare", "spare"]  # the primary is down
    assert async_to_sync(breaker.state)("primary").state == "open"
    # The primary is up again 2 s after its first request; with the default probe intervals
    # (1 s, doubling, at most 8 s) a probe reaches it within 8 s of that, well inside 10 s.
    answered_by, give_up = [], time.monotonic() + 2 + 10
    while time.monotonic() < give_up:
        answered_by.append(ask("hi", max_tokens=2)[-1].target)
        if answered_by[-1] == "primary":
            break
        time.sleep(0.2)
    assert answered_by[-1] == "primary", answered_by
    assert async_to_sync(breaker.state)("primary").state == "closed"


def test_a_look_behind_the_requests_sees_another_process_open_it(settings):
    """Late in its trust a closed breaker is read again in the background while requests go
    through; what another process recorded (an open breaker) ends the trust."""
    settings.ROUTING_BREAKER_CHECK_SECONDS = 0.4
    settings.ROUTING_BREAKER_FAILURES = 1
    name = "behind"

    async def scenario() -> list[bool]:
        seen = [await breaker.allow(name)]  # clean: trusted for 0.4 s
        # Another process's failure opens it (written straight into Redis, as that process would).
        key = f"{settings.REDIS_KEY_PREFIX}:breaker:{name}"
        await core_redis.aclient().hset(
            key,
            mapping={
                "state": "open",
                "failures": 1,
                "opened_at": repr(time.time()),
                "probe_at": repr(time.time() + 30),
            },
        )
        seen.append(await breaker.allow(name))  # still trusted: through
        await asyncio.sleep(0.25)  # the trust's second half
        seen.append(await breaker.allow(name))  # through, and a look starts behind it
        await asyncio.sleep(0.1)
        seen.append(await breaker.allow(name))  # the look found it open: skipped
        return seen

    try:
        assert asyncio.run(scenario()) == [True, True, True, False]
    finally:
        async_to_sync(breaker.reset)(name)


def test_a_look_started_before_a_failure_does_not_undo_it(settings):
    """A look read the breaker clean, then this process recorded a failure, then the look's reply
    landed: the failure stands (not trusted clean, a success will clear it)."""
    settings.ROUTING_BREAKER_CHECK_SECONDS = 0.4
    settings.ROUTING_BREAKER_FAILURES = 5
    name = "raced"

    async def scenario() -> None:
        assert await breaker.allow(name)
        began = breaker._writes.get(name, 0)  # a look begins here and reads "nothing to clear"
        await breaker.failure(name)
        breaker._seen(name, {}, began)  # its reply lands after the failure
        assert name not in breaker._clean_until
        assert name in breaker._dirty

    try:
        asyncio.run(scenario())
        assert async_to_sync(breaker.state)(name).failures == 1
    finally:
        async_to_sync(breaker.reset)(name)
