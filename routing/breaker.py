"""Per-endpoint circuit breaker, shared by every gateway process through Redis.

closed    -> requests flow; consecutive retryable failures are counted.
open      -> after N failures in a row: requests skip the endpoint at once, no timeout paid.
half-open -> when the probe is due, exactly one request (whoever sets the probe key first)
             tries the endpoint; success closes the breaker, failure keeps it open and puts the
             next probe further off: ROUTING_BREAKER_PROBE_FIRST, then twice as long after each
             failed probe, at most ROUTING_BREAKER_COOLDOWN. A failed probe never restarts a
             long cool-down, so an endpoint that recovers gets its traffic back within the cap
             (a primary down for a few seconds was shut out for a whole cool-down at every
             probe); a dead one costs one request per interval.
resting   -> the endpoint answered 429 or 503 with Retry-After: skipped for that long (capped),
             whatever the failure count; the next request after it goes through.

If Redis itself is unreachable the breaker lets requests through: it is an
optimisation of failure handling, never a reason to refuse service.

The supervisor's health checks feed it: an engine that becomes ready (restarted, recovered)
closes the breaker of the endpoint it serves at once, so a restarted engine serves again
without waiting out the cool-down (`inference_ops.signals.engine_ready`, connected by the app).

A healthy endpoint costs no Redis round trip per request: a process that found the breaker
closed with no failures trusts that for ROUTING_BREAKER_CHECK_SECONDS, and a success writes
only when this process last saw something to clear. A failure always goes to Redis at once.
While requests flow no request waits for that look either: one in the second half of that time,
or up to twice it (the look is still on its way), starts the next look in the background and goes
through (a look awaited on a busy loop took tens of milliseconds, for every request that found the
trust run out at once); a look that finds something to clear ends the trust, and the next request
reads the breaker itself (those that find it run out together share one read). So another
process's opening is seen here within twice ROUTING_BREAKER_CHECK_SECONDS.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
from django.conf import settings

from core import redis as core_redis
from core.flight import SingleFlight
from inference_ops.signals import engine_ready

logger = logging.getLogger(__name__)
_TTL = 24 * 3600


@dataclass
class BreakerState:
    state: str  # closed | open | half_open | resting
    failures: int
    opened_at: float | None
    retry_in: float | None  # seconds until a probe may go (open) or the rest ends (resting)


# endpoint -> monotonic time until which this process trusts "closed, no failures".
_clean_until: dict[str, float] = {}
# endpoints whose breaker this process last saw with something to clear (failures, open)
_dirty: set[str] = set()
# endpoint -> count of this process's own writes (a failure, a rest, a reset): a look started
# before one of them lands after it and must not undo what it recorded.
_writes: dict[str, int] = {}
_looks = SingleFlight()
# In ROUTING_BREAKER_CHECK_SECONDS since the last look: a request after AHEAD starts the next look
# in the background and goes through; so does one up to STALE; later a request looks itself.
AHEAD = 0.5
STALE = 2.0


def _redis() -> aioredis.Redis:
    return core_redis.aclient()


def _keys(endpoint: str) -> tuple[str, str]:
    key = f"{settings.REDIS_KEY_PREFIX}:breaker:{endpoint}"
    return key, f"{key}:probe"


async def state(endpoint: str) -> BreakerState:
    return (await states([endpoint]))[endpoint]


async def states(endpoints: list[str]) -> dict[str, BreakerState]:
    """Each endpoint's breaker, read in one round trip (a pipeline). Redis trouble reads as
    closed, as routing then lets requests through."""
    if not endpoints:
        return {}
    pipe = _redis().pipeline(transaction=False)
    for endpoint in endpoints:
        key, probe = _keys(endpoint)
        pipe.hgetall(key)
        pipe.exists(probe)
    try:
        replies = await pipe.execute()
    except Exception:
        logger.warning("breaker state unavailable", exc_info=True)
        return {endpoint: BreakerState("closed", 0, None, None) for endpoint in endpoints}
    return {
        endpoint: _reading(data, probing)
        for endpoint, data, probing in zip(endpoints, replies[::2], replies[1::2], strict=True)
    }


def _reading(data: dict[bytes, bytes], probing: int) -> BreakerState:
    failures = int(data.get(b"failures", 0))
    if data.get(b"state") != b"open":
        resting = float(data.get(b"rest_until", 0)) - time.time()
        if resting > 0:
            return BreakerState("resting", failures, None, resting)
        return BreakerState("closed", failures, None, None)
    opened_at = float(data[b"opened_at"])
    retry_in = _probe_at(data) - time.time()
    if retry_in <= 0 and probing:
        return BreakerState("half_open", failures, opened_at, None)
    return BreakerState(
        "open" if retry_in > 0 else "half_open", failures, opened_at, max(retry_in, 0.0)
    )


def _probe_at(data: Mapping) -> float:
    """When an open breaker's next probe may go (a hash written before probe_at existed: its
    opening plus the first interval)."""
    if b"probe_at" in data:
        return float(data[b"probe_at"])
    return float(data[b"opened_at"]) + _interval(0)


def _interval(failed_probes: int) -> float:
    """The wait before the next probe, after `failed_probes` probes failed in a row."""
    return min(
        settings.ROUTING_BREAKER_COOLDOWN,
        settings.ROUTING_BREAKER_PROBE_FIRST * 2 ** min(failed_probes, 30),
    )


async def allow(endpoint: str) -> bool:
    """May a request go to `endpoint` now? Open: no. Its probe due: one request, the probe."""
    trust = settings.ROUTING_BREAKER_CHECK_SECONDS
    left = _clean_until.get(endpoint, 0.0) - time.monotonic()
    if left > trust * (1 - AHEAD):
        return True
    if left > trust * (1 - STALE):
        writes = _writes.get(endpoint, 0)  # as the look begins, not as its task runs
        _looks.start(endpoint, lambda: _look_behind(endpoint, writes))
        return True
    _key, probe = _keys(endpoint)
    try:
        # The requests that find the trust run out at once share one look.
        data = await _looks.do(endpoint, lambda: _look(endpoint, _writes.get(endpoint, 0)))
        if data.get(b"state") != b"open":
            return float(data.get(b"rest_until", 0)) <= time.time()
        if time.time() < _probe_at(data):
            return False
        # Half-open: the first process to set the probe key sends the probe; the others wait. The
        # key lapses on its own should the probe's process die with it.
        return bool(
            await _redis().set(
                probe, "1", nx=True, ex=max(1, math.ceil(settings.ROUTING_BREAKER_COOLDOWN))
            )
        )
    except Exception:
        logger.warning("breaker unavailable; letting the request through", exc_info=True)
        return True


def _seen(endpoint: str, data: dict, writes: int) -> dict:
    """Note what a look at the breaker found, unless this process wrote to it since the look
    began (`writes`: the count then): nothing to clear is trusted for a while."""
    if _writes.get(endpoint, 0) != writes:
        return data
    if data:
        _dirty.add(endpoint)
        _clean_until.pop(endpoint, None)
    else:
        _dirty.discard(endpoint)
        _clean_until[endpoint] = time.monotonic() + settings.ROUTING_BREAKER_CHECK_SECONDS
    return data


async def _look(endpoint: str, writes: int) -> dict:
    return _seen(endpoint, await _redis().hgetall(_keys(endpoint)[0]), writes)


async def _look_behind(endpoint: str, writes: int) -> dict:
    try:
        return await _look(endpoint, writes)
    except Exception:  # the trust runs out; the next request looks itself
        logger.debug("breaker look behind the requests failed", exc_info=True)
        raise


def _wrote(endpoint: str) -> None:
    """This process is about to write the breaker: stop trusting what it last saw."""
    _writes[endpoint] = _writes.get(endpoint, 0) + 1
    _clean_until.pop(endpoint, None)
    _dirty.add(endpoint)


async def success(endpoint: str) -> None:
    if endpoint not in _dirty:
        return  # clean when this request began, and no failure since: nothing to clear
    try:
        await _redis().delete(*_keys(endpoint))
    except Exception:
        logger.warning("breaker unavailable", exc_info=True)


# One failure, atomically: two processes failing at once cannot both read "not open yet" and lose
# a count, and one round trip instead of five. Open, a failed probe (its key still set) puts the
# next one twice as far off, capped; a request that was already under way when the breaker opened
# changes nothing.
_FAILURE = """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local now = tonumber(ARGV[2])
local first, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('HGET', KEYS[1], 'state') == 'open' then
  if redis.call('DEL', KEYS[2]) == 1 then
    local probes = redis.call('HINCRBY', KEYS[1], 'probes', 1)
    redis.call('HSET', KEYS[1], 'probe_at', now + math.min(cap, first * 2 ^ math.min(probes, 30)))
  end
elseif failures >= tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', ARGV[2], 'probes', 0,
             'probe_at', now + math.min(cap, first))
  redis.call('DEL', KEYS[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return failures
"""


async def failure(endpoint: str) -> None:
    _wrote(endpoint)
    key, probe = _keys(endpoint)
    try:
        await _redis().eval(
            _FAILURE,
            2,
            key,
            probe,
            settings.ROUTING_BREAKER_FAILURES,
            repr(time.time()),
            _TTL,
            settings.ROUTING_BREAKER_PROBE_FIRST,
            settings.ROUTING_BREAKER_COOLDOWN,
        )
    except Exception:
        logger.warning("breaker unavailable", exc_info=True)


async def rest(endpoint: str, seconds: float) -> float:
    """The endpoint answered 429/503 with Retry-After: no process sends it a request for that long
    (at most ROUTING_MAX_RETRY_AFTER seconds), the chain's next target answers meanwhile. Returns
    the rest applied."""
    seconds = min(max(seconds, 0.0), settings.ROUTING_MAX_RETRY_AFTER)
    _wrote(endpoint)
    key, _ = _keys(endpoint)
    try:
        client = _redis()
        await client.hset(key, "rest_until", repr(time.time() + seconds))
        await client.expire(key, _TTL)
    except Exception:
        logger.warning("breaker unavailable", exc_info=True)
    return seconds


async def reset(endpoint: str) -> None:
    _wrote(endpoint)
    await success(endpoint)


def close(endpoint: str) -> None:
    """Close the breaker now, from blocking code: the endpoint's engine was seen ready. Processes
    that saw it open ask Redis on their next request and find it closed."""
    try:
        core_redis.client().delete(*_keys(endpoint))
    except Exception:
        logger.warning("breaker unavailable; %s stays as it was", endpoint, exc_info=True)


def _engine_ready(sender, *, endpoint: str, **kwargs) -> None:
    close(endpoint)


def connect() -> None:
    engine_ready.connect(_engine_ready, dispatch_uid="routing-breaker-engine-ready")
