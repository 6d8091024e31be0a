"""A versioned value read from async code: between checks a reader costs nothing; from the second
half of the check interval to two intervals a read starts the next check behind the readers and
goes on with the value it has; only a read after a quiet spell waits for a check. Real Redis."""

import asyncio
import time
import uuid

import pytest
from django.core.cache import cache

from core.versioned import AHEAD, STALE, Versioned

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL = 0.4


def _versioned() -> tuple[Versioned[int], list[float]]:
    builds: list[float] = []

    def build() -> int:
        builds.append(time.monotonic())
        return len(builds)

    value = Versioned(
        key=f"test:versioned:{uuid.uuid4().hex}",
        build=build,
        check_every=lambda: INTERVAL,
        what="a test value",
    )
    return value, builds


def test_a_read_in_the_second_half_checks_behind_the_readers_and_a_change_lands():
    value, builds = _versioned()

    async def scenario() -> list[int]:
        seen = [await value.aget()]  # no value yet: built, waited for
        cache.set(value.key, "v2", timeout=60)  # another process changed it
        seen.append(await value.aget())  # fresh: the value it has, nothing started
        await asyncio.sleep(INTERVAL * AHEAD + 0.05)
        began = time.monotonic()
        seen.append(await value.aget())  # second half: the old value at once, a check behind
        assert time.monotonic() - began < 0.05
        for _ in range(100):  # the check lands without another read waiting for it
            await asyncio.sleep(0.02)
            if len(builds) == 2:
                break
        seen.append(await value.aget())
        return seen

    assert asyncio.run(scenario()) == [1, 1, 1, 2]
    assert len(builds) == 2


def test_after_a_quiet_spell_a_read_waits_for_the_check():
    value, _builds = _versioned()

    async def scenario() -> list[int]:
        seen = [await value.aget()]
        cache.set(value.key, "v2", timeout=60)
        await asyncio.sleep(INTERVAL * STALE + 0.05)  # nobody read for two intervals
        seen.append(await value.aget())  # expired: this read checks, and sees the change
        return seen

    assert asyncio.run(scenario()) == [1, 2]


def test_an_unchanged_version_costs_no_rebuild():
    value, builds = _versioned()
    cache.set(value.key, "v1", timeout=60)

    async def scenario() -> None:
        for _ in range(4):
            await value.aget()
            await asyncio.sleep(INTERVAL + 0.02)

    asyncio.run(scenario())
    assert len(builds) == 1


def test_a_read_past_the_interval_goes_on_with_the_value_while_the_check_runs():
    value, builds = _versioned()

    async def scenario() -> list[int]:
        seen = [await value.aget()]
        cache.set(value.key, "v2", timeout=60)
        await asyncio.sleep(INTERVAL + 0.05)  # expired, but within two intervals
        began = time.monotonic()
        seen.append(await value.aget())  # the value it has, at once; the check starts
        assert time.monotonic() - began < 0.05
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(builds) == 2:
                break
        seen.append(await value.aget())
        return seen

    assert asyncio.run(scenario()) == [1, 1, 2]
