"""Replica groups: the least busy ready replica answers (a replica with a queue only when every
one has), a conversation keeps its replica while loads are close, a failed replica falls back
to the next; round-robin for comparison."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from inference_ops.models import ModelEndpoint
from routing import pipeline, replicas
from routing.events import RouteRequest
from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_counts():
    replicas.forget()
    yield
    replicas.forget()


@pytest.fixture
def pool(local_sim):
    members = [endpoint(name, local_sim, replica_group="pool") for name in ("r1", "r2", "r3")]
    rule("default", members[0], is_default=True, use_kb_context=False)
    return members


def reported(**loads):
    """What the health checks found on each replica just now: its waiting requests, or its
    gauges."""
    for name, load in loads.items():
        gauges = load if isinstance(load, dict) else {"requests_waiting": load}
        ModelEndpoint.objects.filter(name=name).update(
            **{"requests_waiting": 0, "requests_running": 0, "kv_cache_usage": 0.0, **gauges},
            checked_at=timezone.now(),
            status="ready",
        )
    async_to_sync(replicas.loads_refresh)()


def answered_by(text="Tell me about the sea", **fields) -> str:
    events = ask(text, max_tokens=2, **fields)
    assert events[-1].type == "done", events[-1]
    return events[0].target


def test_the_least_busy_replica_answers(pool):
    reported(r1={"requests_running": 24}, r2={"requests_running": 4}, r3={"requests_running": 20})
    assert answered_by() == "r2"
    reported(r1={"requests_running": 2}, r2={"requests_running": 20}, r3={"requests_running": 16})
    assert answered_by() == "r1"


def test_among_replicas_with_a_queue_a_waiting_request_weighs_more_than_a_running_one(
    pool, settings
):
    settings.ROUTING_AFFINITY_SLACK = 0
    # All three full. r1: 3 waiting + 4 running x 0.25 = 4; r2: 1 + 16 x 0.25 = 5; r3: 3 + 4 = 7.
    reported(
        r1={"requests_waiting": 3, "requests_running": 4},
        r2={"requests_waiting": 1, "requests_running": 16},
        r3={"requests_waiting": 3, "requests_running": 16},
    )
    assert answered_by() == "r1"
    settings.ROUTING_RUNNING_WEIGHT = 0.1  # now r1 is 3.4, r2 2.6
    assert answered_by() == "r2"


def test_a_nearly_full_kv_cache_sends_the_request_elsewhere(pool):
    reported(r1={"kv_cache_usage": 0.92}, r2={"kv_cache_usage": 0.97}, r3={"kv_cache_usage": 0.1})
    assert answered_by() == "r3"


def test_a_replica_with_a_queue_goes_after_one_with_a_free_slot_however_busy(pool):
    # r1 runs 40 (its batch has room), r2 runs 8 with one waiting: a request sent there would wait.
    reported(
        r1={"requests_running": 40},
        r2={"requests_running": 8, "requests_waiting": 1},
        r3={"requests_running": 60},
    )
    assert answered_by() == "r1"


def test_a_replica_s_batch_size_is_learned_and_its_last_slot_filled_here_makes_it_full(
    pool, settings
):
    settings.ROUTING_AFFINITY_SLACK = 0
    reported(
        r1={"requests_running": 2, "requests_waiting": 1},
        r2={"requests_running": 30},
        r3={"requests_running": 30},
    )
    assert replicas.slots_learned(ModelEndpoint.objects.get(name="r1").pk) == 2
    reported(r1={"requests_running": 0}, r2={"requests_running": 30}, r3={"requests_running": 30})
    r1 = ModelEndpoint.objects.get(name="r1").pk
    assert answered_by() == "r1"  # idle now: the least busy
    replicas.started(r1)
    assert answered_by() == "r1"  # one of its two slots taken by a stream of this process
    replicas.started(r1)
    assert answered_by() != "r1"  # both: full, though its gauges say idle
    # Seen running more than that without a queue (restarted bigger): the size is forgotten.
    reported(r1={"requests_running": 3}, r2={"requests_running": 30}, r3={"requests_running": 30})
    assert replicas.slots_learned(r1) is None


def test_a_replica_whose_slots_in_this_process_are_taken_is_full(local_sim, settings):
    settings.ROUTING_AFFINITY_SLACK = 0
    narrow = endpoint("narrow", local_sim, replica_group="pool", max_concurrency=1)
    wide = endpoint("wide", local_sim, replica_group="pool")
    rule("default", narrow, is_default=True, use_kb_context=False)
    reported(
        narrow={"requests_running": 0}, wide={"requests_running": 16}
    )  # narrow is the less busy
    assert answered_by() == "narrow"
    replicas.started(narrow.pk)  # its one slot here taken: a request would wait for it
    assert answered_by() == "wide"
    assert wide.max_concurrency > 1


def test_a_conversation_leaves_its_replica_when_that_one_is_full(pool):
    history = [
        {"role": "user", "content": "My order 1234 has not arrived"},
        {"role": "assistant", "content": "Let me look."},
    ]
    reported(r1=0, r2=0, r3=0)
    home = answered_by("And when will it?", history=history)
    others = [m.name for m in pool if m.name != home]
    reported(
        **{
            home: {"requests_running": 4, "requests_waiting": 1},
            others[0]: {"requests_running": 12},
            others[1]: {"requests_running": 16},
        }
    )  # busier than home by the gauges, but with room
    assert answered_by("Can you check again?", history=history) == others[0]


def test_a_replica_a_fresh_check_found_down_goes_last(pool):
    reported(r1=5, r2=0, r3=9)
    ModelEndpoint.objects.filter(name="r2").update(status="down")
    async_to_sync(replicas.loads_refresh)()
    assert answered_by() == "r1"


def test_gauges_older_than_their_freshness_are_not_trusted(pool, settings):
    reported(r1=0, r2=9, r3=9)
    ModelEndpoint.objects.update(
        checked_at=timezone.now() - timedelta(seconds=settings.ROUTING_LOAD_FRESH_SECONDS + 5)
    )
    async_to_sync(replicas.loads_refresh)()
    # Nothing trusted, nothing in flight: every question goes to its conversation's own replica.
    homes = {answered_by(f"question number {n}") for n in range(12)}
    assert len(homes) > 1


def test_a_conversation_keeps_its_replica_while_loads_are_close(pool, settings):
    settings.ROUTING_AFFINITY_SLACK = 2
    history = [
        {"role": "user", "content": "My order 1234 has not arrived"},
        {"role": "assistant", "content": "Let me look."},
    ]
    reported(r1=0, r2=0, r3=0)
    home = answered_by("And when will it?", history=history)
    others = [m.name for m in pool if m.name != home]
    # 8 running (2) and 4 (1) against none: busier, but within the slack
    reported(**{home: {"requests_running": 8}, others[0]: 0, others[1]: {"requests_running": 4}})
    assert answered_by("Can you check again?", history=history) == home
    # 20 running (5): too busy now, the least busy takes it
    reported(**{home: {"requests_running": 20}, others[0]: 0, others[1]: {"requests_running": 4}})
    assert answered_by("Still nothing?", history=history) == others[0]


def test_requests_in_flight_spread_over_the_replicas(slow_pool, settings):
    # no conversation to keep: the next request goes where fewest are
    settings.ROUTING_AFFINITY_SLACK = 0

    async def many():
        streams = [
            pipeline.answer(RouteRequest(text=f"story {n}", max_tokens=20)) for n in range(6)
        ]
        firsts = await asyncio.gather(*(s.__anext__() for s in streams))
        for stream in streams:
            await stream.aclose()
        return [event.target for event in firsts]

    reported(s1=0, s2=0, s3=0)
    targets = async_to_sync(many)()
    assert sorted(targets) == ["s1", "s1", "s2", "s2", "s3", "s3"]


def test_a_replica_that_fails_falls_back_to_the_next(local_sim):
    dead = endpoint("r0", url="http://127.0.0.1:9/v1", replica_group="pool")
    alive = endpoint("r1", local_sim, replica_group="pool")
    rule("default", alive, is_default=True, use_kb_context=False)
    reported(r0=0, r1=3)
    events = ask("Tell me about the sea", max_tokens=2)
    assert events[0].target == "r1" and events[-1].fell_back_from == ("r0",)
    assert dead.replica_group == "pool"


def test_round_robin_takes_turns(pool, settings):
    settings.ROUTING_REPLICA_PICK = "round_robin"
    reported(r1=9, r2=0, r3=0)
    picked = [answered_by(f"question {n}") for n in range(6)]
    assert sorted(set(picked)) == ["r1", "r2", "r3"] and picked[:3] != picked[3:4] * 3


def test_a_named_endpoint_is_the_one_that_answers(pool):
    reported(r1=9, r2=0, r3=0)
    assert answered_by(model="r1") == "r1"


@pytest.fixture
def slow_pool():
    from tests.inference_ops.simulator_process import start_simulator

    sims = [
        start_simulator(
            "serve",
            "acme/local",
            "--mode",
            "echo",
            "--time-to-first-token",
            "200",
            "--inter-token-latency",
            "50",
        )
        for _ in range(3)
    ]
    members = [endpoint(f"s{n}", sim, replica_group="pool") for n, sim in enumerate(sims, start=1)]
    rule("default", members[0], is_default=True, use_kb_context=False)
    yield members
    for sim in sims:
        sim.stop()


@pytest.fixture
def capped_pool(settings):
    """Two replicas of one group, each with a capacity of one: answers that take long."""
    import redis

    from tests.inference_ops.simulator_process import start_simulator

    def forget_places():
        client = redis.Redis.from_url(settings.REDIS_URL)
        for name in ("capped-a", "capped-b"):
            keys = client.keys(f"{settings.REDIS_KEY_PREFIX}:admission:{name}:*")
            if keys:
                client.delete(*keys)

    forget_places()
    sims = [
        start_simulator("serve", "acme/local", "--mode", "echo", "--inter-token-latency", "500")
        for _ in range(2)
    ]
    members = [
        endpoint(
            f"capped-{letter}",
            sim,
            replica_group="capped",
            capacity=1,
            idle_timeout=60,
            total_timeout=120,
        )
        for letter, sim in zip("ab", sims, strict=True)
    ]
    rule("default", members[0], is_default=True, use_kb_context=False)
    yield members
    for sim in sims:
        sim.stop()
    forget_places()


def test_a_replica_group_is_admitted_as_one_pool(capped_pool, settings):
    settings.ROUTING_AFFINITY_SLACK = -1  # no conversation kept: the order is the loads'
    settings.ADMISSION_DEADLINE_INTERACTIVE = 120
    reported(**{"capped-b": {"requests_running": 2}})  # b looks busier: a is always tried first

    async def three():
        streams = [
            pipeline.answer(RouteRequest(text=f"story {n} " * 50, max_tokens=100)) for n in range(3)
        ]
        try:
            first = await streams[0].__anext__()
            # a is full: the second takes b's room rather than wait in a's queue.
            second = await streams[1].__anext__()
            third = asyncio.ensure_future(streams[2].__anext__())
            await asyncio.sleep(0.5)
            waited = not third.done()  # both replicas full: it waits
            await streams[1].aclose()  # b's answer ends; a's goes on
            async with asyncio.timeout(60):
                last = await third
            return first.target, second.target, waited, last.target
        finally:
            for stream in streams:
                await stream.aclose()
            # The places given back, in the background, before this loop closes.
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            async with asyncio.timeout(20):
                await asyncio.gather(*others, return_exceptions=True)

    first, second, waited, last = async_to_sync(three)()
    assert (first, second) == ("capped-a", "capped-b")
    assert waited
    assert last == "capped-b"  # the room at b, though a comes first in its order
