"""How long an answer will hold its engine, told before it starts: what a request to an endpoint
priced per engine-second reserves against a money budget (spend.ledger).

An answer's engine time is known only at its end (its stream's duration), and a reservation that
falls short of it lets concurrent answers pass a budget together: priced at no time at all, as
before, a budget priced per engine-second never refused. So a request reserves its ceiling in time:
the endpoint's pace (seconds per token) times the tokens it may take, its prompt weighed at
PROMPT_SHARE of an answer's token (an engine reads a prompt many tokens per step, and writes an
answer one token per step) and its max_tokens for every choice, and never more than the endpoint's
total timeout, past which the client ends the stream (inference_ops.client).

The pace is measured in each process from the answers each endpoint finished there: the slowest of
the last two PACE_WINDOWs in which it finished any, so the estimate follows an engine that slows
under load at once and forgets a slow spell only after a quiet window. An endpoint that has not
finished an answer in this process yet gets DEFAULT_PACE, a slow engine's. The measure is
per process on purpose: no Redis trip on the request's way, and each process's own answers are
what its reservations must cover.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Seconds per token before an endpoint has finished an answer here: a loaded CPU engine's pace,
# several times a GPU engine's, so the first reservations err high.
DEFAULT_PACE = 0.25
# What a prompt token weighs against an answer token: an engine prefills a prompt in chunks of
# many tokens per step, where it decodes one token per sequence per step. A generous share: a long
# prompt after short ones must not be priced at nothing.
PROMPT_SHARE = 1 / 8
PACE_WINDOW = 60.0  # seconds


@dataclass(slots=True)
class _Pace:
    window: int  # the PACE_WINDOW of the last answer measured
    slowest: float  # in that window
    before: float  # in the window with answers before it (0: none yet)


_paces: dict[int, _Pace] = {}


def _units(prompt_tokens: int, completion_tokens: int) -> float:
    return prompt_tokens * PROMPT_SHARE + completion_tokens


def pace(endpoint_id: int) -> float:
    """The endpoint's pace in seconds per token, as this process last saw it (the slower of its
    last two windows), or DEFAULT_PACE."""
    found = _paces.get(endpoint_id)
    return DEFAULT_PACE if found is None else max(found.slowest, found.before)


def estimate(
    endpoint_id: int, *, prompt_tokens: int, completion_tokens: int, ceiling: float
) -> float:
    """The engine seconds a request may take: its tokens at the endpoint's pace, at most
    `ceiling` (the endpoint's total timeout)."""
    return min(ceiling, _units(prompt_tokens, completion_tokens) * pace(endpoint_id))


def observe(
    endpoint_id: int, *, prompt_tokens: int, completion_tokens: int, seconds: float
) -> None:
    """An answer of the endpoint finished: its tokens took `seconds` of the engine."""
    if seconds <= 0:
        return
    measured = seconds / max(1.0, _units(prompt_tokens, completion_tokens))
    window = int(time.monotonic() // PACE_WINDOW)
    found = _paces.get(endpoint_id)
    if found is None:
        _paces[endpoint_id] = _Pace(window, measured, 0.0)
    elif found.window == window:
        found.slowest = max(found.slowest, measured)
    else:
        found.window, found.before, found.slowest = window, found.slowest, measured
