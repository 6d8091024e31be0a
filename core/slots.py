"""Leased slots in Redis: at most `limit` holders of one key at a time, across every process.

A key is a sorted set of holders scored by the end of their lease. Taking a slot first drops
the holders whose lease ended, then adds this one if fewer than `limit` remain: one script, so
two processes taking the last slot at once cannot both get it. Giving it back is one ZREM. A
process that dies holding slots cannot leak them for longer than the lease: choose a lease
that outlasts anything a holder legitimately does, since a holder still at work after it no
longer counts.

The script reads Redis's own clock, so the processes' clocks need not agree. Taking is queued
on a pipeline the caller executes, so it travels with the caller's other commands in one round
trip.
"""

from __future__ import annotations

import math
import secrets

# KEYS[1] the set; ARGV: limit, lease in seconds, holder. Returns 1 when taken, 0 when full.
_TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""


def holder() -> str:
    """A fresh holder name, unique across processes."""
    return secrets.token_hex(8)


def take(pipe, *, key: str, holder: str, limit: int, lease: float) -> None:
    """Queue the taking of a slot on `pipe`; its result (truthy when taken) is the pipeline's next
    one. Sent as EVAL, not EVALSHA: a pipeline would otherwise ask Redis whether the script is
    loaded each time, a round trip of its own, and Redis keeps the compiled script by its hash
    anyway."""
    pipe.eval(_TAKE, 1, key, limit, math.ceil(lease), holder)


def give_back(client, *, key: str, holder: str):
    """Give a slot back (nothing happens if its lease already ended); returns what `client.zrem`
    does: the count, or an awaitable of it from an asyncio client."""
    return client.zrem(key, holder)
