"""Leased slots in real Redis: a limit shared by every connection, and no slot kept past its
lease."""

import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings

from core import slots


@pytest.fixture
def key():
    name = f"{settings.REDIS_KEY_PREFIX}:test:slots:{time.monotonic_ns()}"
    yield name
    redis.Redis.from_url(settings.REDIS_URL).delete(name)


def take(client, key, holder, *, limit=2, lease=60) -> bool:
    pipe = client.pipeline(transaction=False)
    slots.take(pipe, key=key, holder=holder, limit=limit, lease=lease)
    return bool(pipe.execute()[0])


def test_the_limit_holds_across_connections_and_a_slot_given_back_is_free_again(key):
    one, two = redis.Redis.from_url(settings.REDIS_URL), redis.Redis.from_url(settings.REDIS_URL)
    assert take(one, key, "a") and take(two, key, "b")
    assert not take(one, key, "c") and not take(two, key, "c")
    slots.give_back(one, key=key, holder="b")
    assert take(two, key, "c")
    assert not take(one, key, "d")


@pytest.mark.processes
def test_a_process_that_dies_holding_slots_loses_them_when_their_lease_ends(key):
    script = (
        "import os, redis; from core import slots; "
        f"pipe = redis.Redis.from_url({settings.REDIS_URL!r}).pipeline(transaction=False); "
        f"[slots.take(pipe, key={key!r}, holder=h, limit=2, lease=1) for h in ('x', 'y')]; "
        "assert pipe.execute() == [1, 1]; os._exit(9)"
    )
    died = subprocess.run([sys.executable, "-c", script], cwd=settings.BASE_DIR, timeout=60)
    assert died.returncode == 9  # gone without giving anything back
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert set(client.zrange(key, 0, -1)) == {b"x", b"y"}  # both slots still taken
    time.sleep(1.5)  # past the lease: waiting longer can only make it more so
    assert take(client, key, "mine")
    assert client.zrange(key, 0, -1) == [b"mine"]
