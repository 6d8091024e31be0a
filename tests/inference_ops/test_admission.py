"""Admission at an endpoint's capacity, over real Redis: exact across event loops and processes,
a quiet tenant before a noisy one's backlog, a deadline that ends in a clean refusal, a dead
holder's place returned by its lease, and admission by each process alone when Redis is down.

No timing is asserted: the waits are bounded by deadlines only so that a broken admission fails
instead of hanging."""

import asyncio
import http.client
import json
import subprocess
import sys
import threading
import time

import pytest
import redis
from django.conf import settings

from inference_ops import admission, admission_gate, probes
from inference_ops.exceptions import EngineError
from tests.support.polling import wait_until


@pytest.fixture
def name():
    endpoint = f"test-admission-{time.monotonic_ns()}"
    yield endpoint
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = client.keys(f"{settings.REDIS_KEY_PREFIX}:admission:{endpoint}*")
    if keys:
        client.delete(*keys)


@pytest.fixture
def no_reserve(settings):
    settings.ADMISSION_RESERVE = 0


async def settled():
    """The places given back and the waiting set's entries withdrawn: their Redis work runs in
    the background, after the request."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    async with asyncio.timeout(20):
        await asyncio.gather(*others, return_exceptions=True)


@pytest.fixture(autouse=True)
async def background_work_done():
    yield
    await settled()


async def enter(name, tenant, *, capacity=1, tokens=100, priority="api"):
    admission.ticket.set(admission.Ticket(tenant=tenant, priority=priority, tokens=tokens))
    return await admission_gate.admit(name, capacity, 60.0)


async def test_a_quiet_tenant_is_admitted_before_a_noisy_tenants_backlog(name, no_reserve):
    held = await enter(name, "noisy", tokens=5000)
    order: list[str] = []

    async def one(tenant, tokens, label):
        place = await enter(name, tenant, tokens=tokens)
        order.append(label)
        await asyncio.sleep(0)  # let the next waiter see the slot taken before it is given back
        place.leave()

    backlog = [asyncio.create_task(one("noisy", 5000, f"noisy {i}")) for i in range(3)]
    await asyncio.sleep(0.2)  # the backlog queued first
    quiet = asyncio.create_task(one("quiet", 50, "quiet"))
    await asyncio.sleep(0.1)
    assert order == []  # everyone waits while the slot is held
    held.leave()
    async with asyncio.timeout(20):
        await asyncio.gather(quiet, *backlog)
    assert order == ["quiet", "noisy 0", "noisy 1", "noisy 2"]


async def test_the_better_class_goes_first_whatever_its_tenant_used(name, no_reserve):
    held = await enter(name, "someone")
    order: list[str] = []

    async def one(tenant, tokens, priority):
        place = await enter(name, tenant, tokens=tokens, priority=priority)
        order.append(priority)
        place.leave()

    batch = asyncio.create_task(one("light", 1, "batch"))
    await asyncio.sleep(0.1)
    interactive = asyncio.create_task(one("heavy", 100_000, "interactive"))
    await asyncio.sleep(0.1)
    held.leave()
    async with asyncio.timeout(20):
        await asyncio.gather(batch, interactive)
    assert order == ["interactive", "batch"]


def test_the_capacity_holds_across_event_loops_and_each_place_given_back_is_taken(
    name, no_reserve, settings
):
    settings.ADMISSION_DEADLINE_API = 1.0
    capacity, each = 3, 5
    admitted: list[admission_gate.Admitted] = []
    refused: list[EngineError] = []
    lock = threading.Lock()
    go = threading.Barrier(2)

    def loop_of(tenant):
        async def run():
            go.wait()

            async def one():
                try:
                    place = await enter(name, tenant, capacity=capacity)
                except EngineError as exc:
                    with lock:
                        refused.append(exc)
                else:
                    with lock:
                        admitted.append(place)

            await asyncio.gather(*(one() for _ in range(each)))
            await settled()

        asyncio.run(run())

    threads = [threading.Thread(target=loop_of, args=(t,)) for t in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Each loop alone would have let `capacity` in: together they let in exactly that many.
    assert len(admitted) == capacity
    assert len(refused) == 2 * each - capacity
    assert {exc.kind for exc in refused} == {"busy"}
    held = redis.Redis.from_url(settings.REDIS_URL).zcard(
        f"{settings.REDIS_KEY_PREFIX}:admission:{name}:held"
    )
    assert held == capacity


async def test_a_request_that_finds_no_room_by_its_deadline_is_refused_with_a_retry_after(
    name, settings
):
    settings.ADMISSION_DEADLINE_API = 0.3
    held = await enter(name, "first")
    with pytest.raises(EngineError) as refused:
        await enter(name, "second")
    assert refused.value.kind == "busy" and refused.value.retryable
    assert refused.value.retry_after >= 1
    assert "no room" in str(refused.value)
    held.leave()
    await settled()  # the place given back and the refused wait withdrawn, in the background
    settings.ADMISSION_DEADLINE_API = 20  # a deadline for a hang only, not for a busy CPU
    again = await enter(name, "second")  # the place given back is free again
    again.leave()


async def test_one_tenant_leaves_the_reserve_to_the_others(name, settings):
    settings.ADMISSION_RESERVE = 1
    settings.ADMISSION_DEADLINE_API = 0.3
    mine = [await enter(name, "busy", capacity=3) for _ in range(2)]
    with pytest.raises(EngineError):
        await enter(name, "busy", capacity=3)  # the last slot is not for the busy tenant
    other = await enter(name, "other", capacity=3)  # but is there for anyone else
    for place in (*mine, other):
        place.leave()


@pytest.mark.processes
def test_a_process_that_dies_holding_a_place_loses_it_when_its_lease_ends(name, child_env):
    script = (
        "import asyncio, os, django; django.setup(); "
        "from inference_ops import admission_gate; admission_gate.LEASE_MARGIN = 0; "
        f"asyncio.run(admission_gate.admit({name!r}, 1, 1.0)); os._exit(9)"
    )
    env = {**child_env, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    died = subprocess.run(
        [sys.executable, "-c", script], cwd=settings.BASE_DIR, env=env, timeout=60
    )
    assert died.returncode == 9  # gone without giving its place back
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.zcard(f"{settings.REDIS_KEY_PREFIX}:admission:{name}:held") == 1

    async def after_the_lease():
        place = await enter(name, "next")  # waits for the lease's end, within its deadline
        await settled()
        return place

    place = asyncio.run(after_the_lease())
    assert place.slot.startswith("next|")


async def test_without_redis_each_process_admits_up_to_the_capacity_alone(name, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.ADMISSION_DEADLINE_API = 0.3
    before = admission.UNCHECKED._value.get()
    places = [await enter(name, "someone", capacity=2) for _ in range(2)]
    with pytest.raises(EngineError) as refused:
        await enter(name, "someone", capacity=2)
    assert refused.value.kind == "busy"
    assert admission.UNCHECKED._value.get() > before  # counted as unchecked
    places[0].leave()
    again = await enter(name, "someone", capacity=2)
    for place in (places[1], again):
        place.leave()


async def test_a_tenant_holding_all_it_may_does_not_keep_another_waiting(name, settings):
    settings.ADMISSION_RESERVE = 1
    settings.ADMISSION_DEADLINE_API = 5.0
    held = [await enter(name, "noisy", capacity=3, tokens=5000) for _ in range(2)]
    backlog = [asyncio.create_task(enter(name, "noisy", capacity=3, tokens=5000)) for _ in range(3)]
    await asyncio.sleep(0.1)  # queued here, first in line
    quiet = await enter(name, "quiet", capacity=3, tokens=50)  # the free slot, no one leaving
    assert quiet.slot.startswith("quiet|")
    assert not any(task.done() for task in backlog)
    for place in (*held, quiet):
        place.leave()
    async with asyncio.timeout(20):
        for admitted in asyncio.as_completed(backlog):  # two at a time: the reserve holds
            (await admitted).leave()


# --- the room the engine's own gauges leave -------------------------------------------------------


class OutsideStreams:
    """Streams sent straight to an engine, not through the gateway: another client of it."""

    def __init__(self, url: str):
        self.url = url
        self.connections: list[http.client.HTTPConnection] = []

    def open(self, count: int) -> None:
        for _ in range(count):
            connection = http.client.HTTPConnection(*self.url.split("//")[1].split(":"), timeout=10)
            body = {
                "model": "acme/local",
                "messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": 1000,
                "ignore_eos": True,
                "stream": True,
            }
            connection.request(
                "POST",
                "/v1/chat/completions",
                body=json.dumps(body),
                headers={"Content-Type": "application/json"},
            )
            assert connection.getresponse().status == 200
            self.connections.append(connection)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()  # the engine aborts the request
        self.connections.clear()


@pytest.fixture
def slow_engine():
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve", "acme/local", "--max-num-seqs", "2", "--inter-token-latency", "1000"
    )
    outside = OutsideStreams(sim.url)
    yield sim, outside
    outside.close()
    sim.stop()


def checked(sim, name, capacity):
    """A health check's scrape of the engine, as the checks report it to admission."""
    healthy, reason, metrics = probes.probe_url(sim.url, "acme/local", 10)
    assert healthy, reason
    admission.engine_report(name=name, capacity=capacity, metrics=metrics)
    return metrics


def admitted_of(name, capacity, tries):
    """How many of `tries` requests of different tenants find room at once (none leaves)."""

    async def run():
        places = []
        for n in range(tries):
            try:
                places.append(await enter(name, f"tenant {n}", capacity=capacity))
            except EngineError as exc:
                assert exc.kind == "busy"
        for place in places:
            place.leave()
        await settled()
        return len(places)

    return asyncio.run(run())


def test_requests_the_engine_runs_for_others_count_against_the_room(
    name, slow_engine, no_reserve, settings
):
    settings.ADMISSION_DEADLINE_API = 0.3
    sim, outside = slow_engine
    outside.open(1)
    assert checked(sim, name, 4)["running"] == 1
    assert admitted_of(name, 4, 5) == 3  # four, less the one the engine runs for someone else
    outside.close()
    assert wait_until(lambda: checked(sim, name, 4)["running"] == 0)
    assert admitted_of(name, 4, 5) == 4  # gone: the whole capacity again


def test_an_engine_with_its_own_queue_gets_one_at_a_time_never_none(
    name, slow_engine, no_reserve, settings
):
    settings.ADMISSION_DEADLINE_API = 0.3
    sim, outside = slow_engine
    outside.open(3)  # it runs two (--max-num-seqs 2) and queues one
    metrics = checked(sim, name, 4)
    assert (metrics["running"], metrics["waiting"]) == (2, 1)
    assert admitted_of(name, 4, 3) == 1


def test_a_full_kv_cache_admits_no_more_than_the_engine_runs(
    name, slow_engine, no_reserve, settings
):
    settings.ADMISSION_DEADLINE_API = 0.3
    sim, outside = slow_engine
    outside.open(1)
    settings.ADMISSION_KV_THRESHOLD = 0.0  # any use is past it
    checked(sim, name, 4)
    # It runs one, someone else's: the gateway may add none (but never less than one).
    assert admitted_of(name, 4, 3) == 1
    settings.ADMISSION_KV_THRESHOLD = 1.0
    checked(sim, name, 4)
    assert admitted_of(name, 4, 4) == 3


def test_an_old_report_counts_for_nothing(name, slow_engine, no_reserve, settings):
    settings.ADMISSION_DEADLINE_API = 0.3
    sim, outside = slow_engine
    outside.open(3)
    checked(sim, name, 4)
    settings.ROUTING_LOAD_FRESH_SECONDS = 0.0  # the report just made is already too old
    assert admitted_of(name, 4, 5) == 4


@pytest.mark.django_db
def test_the_endpoint_health_check_reports_the_engines_room(
    name, slow_engine, no_reserve, settings
):
    from inference_ops.endpoint_checks import endpoint_check
    from tests.support.factories import endpoint

    settings.ADMISSION_DEADLINE_API = 0.3
    sim, outside = slow_engine
    outside.open(2)
    row = endpoint(name, sim, capacity=3)
    assert endpoint_check(endpoint_id=row.pk) == "ready"
    assert admitted_of(name, 3, 3) == 1  # three, less the two it runs for someone else


# --- a replica group as one pool ------------------------------------------------------------------


async def test_a_pool_takes_the_next_replica_s_room_and_gives_it_back_if_the_chain_leaves(name):
    a, b = f"{name}-a", f"{name}-b"
    pools = {a: ((a, 1, 60.0), (b, 1, 60.0)), b: ((b, 1, 60.0),)}
    admission.ticket.set(admission.Ticket(tenant="first", pools=pools))
    held = await admission_gate.admit(a, 1, 60.0)  # a's room
    waiting = admission.Ticket(tenant="second", pools=pools)
    admission.ticket.set(waiting)
    with pytest.raises(EngineError) as moved:
        await admission_gate.admit(a, 1, 60.0)  # a is full: b's room is taken, a fails at once
    assert moved.value.kind == "busy" and b in str(moved.value)
    place = await admission_gate.admit(b, 1, 60.0)  # the chain's next replica: its place kept
    assert place.name == b and place.slot.startswith("second|")
    place.leave()

    with pytest.raises(EngineError):
        await admission_gate.admit(a, 1, 60.0)  # b's room taken again
    other = await admission_gate.admit(f"{name}-c", 1, 60.0)  # the chain went elsewhere
    await settled()
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.zcard(f"{settings.REDIS_KEY_PREFIX}:admission:{b}:held") == 0  # given back
    for one in (held, other):
        one.leave()
