import asyncio

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings

from inference_ops.models import ModelEndpoint
from routing import pipeline
from routing.models import RouteTarget, RoutingRule
from routing.rules import rules_changed
from tests.inference_ops.simulator_process import start_simulator


@pytest.fixture(scope="session")
def local_sim():
    sim = start_simulator("serve", "acme/local", "--max-num-seqs", "8", "--time-to-first-token", "5",
                          "--inter-token-latency", "5", "--mode", "echo")
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def external_sim():
    sim = start_simulator("serve", "acme/external", "--time-to-first-token", "5", "--inter-token-latency", "2")
    yield sim
    sim.stop()


@pytest.fixture(autouse=True)
def fresh_routing_state():
    """Each test starts with closed breakers and rebuilds its rule snapshot."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    for key in client.scan_iter("gw:breaker:*"):
        client.delete(key)
    rules_changed()
    yield
    rules_changed()


def endpoint(name, sim=None, *, kind="vllm", model=None, url=None, **fields):
    base = url or f"{sim.url}/v1"
    return ModelEndpoint.objects.create(
        name=name, kind=kind, base_url=base, model=model or ("acme/local" if kind != "external" else "acme/external"),
        **{"connect_timeout": 1, "first_token_timeout": 2, "idle_timeout": 2, "total_timeout": 20, **fields},
    )


def rule(name, *targets, priority=100, **fields):
    created = RoutingRule.objects.create(name=name, priority=priority, **fields)
    for position, spec in enumerate(targets, start=1):
        specs = spec if isinstance(spec, list) else [(spec, 100)]
        for item in specs:
            target_endpoint, weight = item if isinstance(item, tuple) else (item, 100)
            RouteTarget.objects.create(rule=created, position=position, endpoint=target_endpoint, weight=weight)
    return created


async def _collect(request, rng=None):
    return [event async for event in pipeline.answer(request, rng=rng)]


def ask(text, **fields):
    """Run the pipeline from a sync test: its ORM calls share the test's transaction."""
    return async_to_sync(_collect)(pipeline.RouteRequest(text=text, **fields))


def kinds(events):
    return [e.type for e in events]


def answer_text(events):
    return "".join(e.text for e in events if e.type == "token")


__all__ = ["asyncio", "endpoint", "rule", "ask", "kinds", "answer_text"]
