"""Which endpoints an engine of ours cannot serve right now, as the answer pipeline needs to know
it: the engine is starting (or waiting to restart), or its port is held by a process the gateway
did not start.

Read once per request for a local target, so it costs nothing when engines are up: a map built
from the engine rows once per process and rebuilt when the supervisor changes an engine's status
(core.versioned: a version in Redis checked at most every ROUTING_RULES_CHECK_SECONDS, no query
or round trip between checks). Only a question that meets a starting engine reads the row again,
while it waits for it (one read per endpoint and process at a time), and an answer whose engine
seems to have died mid-stream, while it waits for the supervisor's word on it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from core import db
from core.flight import SingleFlight
from core.versioned import Versioned
from inference_ops.models import EngineProcess

Status = EngineProcess.Status
# What a caller is told to wait before asking again while an engine starts: short, since the
# start's end is not known (vLLM takes a minute or more on a CPU, seconds on a warm GPU host).
STARTING_RETRY_AFTER = 5.0
WAIT_STEP = 0.5  # seconds between looks at a starting engine's row


def _verdict_seconds() -> float:
    # The check a failure report asks for comes at once; one debounced away (another request
    # reported the engine a moment ago) comes with the beat's next round.
    return settings.ENGINE_CHECK_INTERVAL + settings.ENGINE_CHECK_TIMEOUT + 1.0


@dataclass(frozen=True)
class Unserved:
    """Why an endpoint's engine cannot answer now, as the caller and the route's notes say it."""

    code: str  # engine_starting | engine_port_taken
    note: str  # for operators: the route's explanation, the request log
    message: str  # for the caller
    retryable: bool
    retry_after: float | None


def _starting(engine: EngineProcess, now) -> Unserved:
    wait = STARTING_RETRY_AFTER
    if engine.status == Status.RESTARTING and engine.next_restart_at:
        wait += max(0.0, (engine.next_restart_at - now).total_seconds())
    return Unserved(
        code="engine_starting",
        note=f"its engine {engine.name} is {engine.status}",
        message=f"The local model is starting; try again in about {wait:.0f} s.",
        retryable=True,
        retry_after=wait,
    )


def _port_taken(engine: EngineProcess) -> Unserved:
    return Unserved(
        code="engine_port_taken",
        note=f"its engine {engine.name} is not running: {engine.status_reason}",
        message="The local model is not running: its port is held by another program.",
        retryable=False,
        retry_after=None,
    )


def states_build(endpoint_id: int | None = None) -> dict[int, Unserved]:
    """Endpoint id -> why it is not served, for the endpoints whose engines are all starting or
    kept from their port (an endpoint with one engine serving is served)."""
    engines = EngineProcess.objects.filter(
        Q(
            desired_state=EngineProcess.Desired.RUNNING,
            status__in=(Status.STARTING, Status.RESTARTING),
        )
        | Q(status=Status.PORT_TAKEN)
        | Q(status__in=(Status.READY, Status.UNHEALTHY))
    ).only("name", "endpoint_id", "status", "status_reason", "next_restart_at")
    if endpoint_id is not None:
        engines = engines.filter(endpoint_id=endpoint_id)
    now = timezone.now()
    found: dict[int, Unserved] = {}
    serving = set()
    for engine in engines:
        if engine.status in (Status.READY, Status.UNHEALTHY):
            serving.add(engine.endpoint_id)
        elif engine.status == Status.PORT_TAKEN:
            found[engine.endpoint_id] = _port_taken(engine)
        else:
            found.setdefault(engine.endpoint_id, _starting(engine, now))
    return {key: value for key, value in found.items() if key not in serving}


_states: Versioned[dict[int, Unserved]] = Versioned(
    key="inference_ops:engine-states:version",
    build=states_build,
    check_every=lambda: settings.ROUTING_RULES_CHECK_SECONDS,
    what="the engines' states",
)
_looks = SingleFlight()


def changed() -> None:
    """An engine's status changed (call after commit)."""
    _states.changed()


async def _look(endpoint_id: int) -> Unserved | None:
    async def read() -> Unserved | None:
        return (await db.run(states_build, endpoint_id)).get(endpoint_id)

    return await _looks.do(endpoint_id, read)


async def unserved(
    endpoint_id: int, *, wait: float = 0.0, failed_at: datetime | None = None
) -> Unserved | None:
    """None when this endpoint is not known to be kept from serving (the hot path's answer: no
    I/O). An engine that is starting is waited for up to `wait` seconds (the question's
    first-token budget): None as soon as it is ready, else why it is still not served.

    `failed_at`: when a request found the engine seemingly gone (its stream broke), a failure
    reported to its supervisor (routing.engine_failures). With a `wait`, the supervisor's check
    since then is waited for first, read from the rows (the map may lag it): an engine found dead
    is restarting, and is waited for as it starts, instead of its closed port being tried."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    if failed_at is not None and wait > 0:
        until = min(deadline, loop.time() + _verdict_seconds())
        found = await _verdict(endpoint_id, failed_at, until=until)
    else:
        found = (await _states.aget()).get(endpoint_id)
    if found is None or found.code != "engine_starting" or wait <= 0:
        return found
    while loop.time() < deadline:
        await asyncio.sleep(min(WAIT_STEP, max(0.0, deadline - loop.time())))
        found = await _look(endpoint_id)
        if found is None or found.code != "engine_starting":
            return found
    return found


def _verdict_read(endpoint_id: int, since: datetime) -> tuple[Unserved | None, bool]:
    """Why the endpoint is not served, and whether its engines' supervisor has looked at them
    since `since` (a check writes `last_check_at`, a change of status `status_changed_at`); True
    as well when it has no engine of ours: no check is coming."""
    looked = EngineProcess.objects.filter(endpoint_id=endpoint_id).values_list(
        "last_check_at", "status_changed_at"
    )
    if not looked:
        return None, True
    seen = any(at is not None and at >= since for row in looked for at in row)
    return states_build(endpoint_id).get(endpoint_id), seen


async def _verdict(endpoint_id: int, since: datetime, *, until: float) -> Unserved | None:
    """The supervisor's word on an engine reported gone at `since`: why it is not served (it is
    restarting), or None once a check found it running, or at `until` without a word."""
    loop = asyncio.get_running_loop()
    while True:
        found, seen = await db.run(_verdict_read, endpoint_id, since)
        if found is not None or seen or loop.time() >= until:
            return found
        await asyncio.sleep(WAIT_STEP)
