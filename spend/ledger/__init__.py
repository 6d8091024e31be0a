"""Spend counted in Redis, one count for every web process and replica.

Each limit is a counter per fixed window: requests and tokens per UTC minute, tokens per UTC day,
money (in micro-units) per UTC day or month. A request that goes to a model reserves before it
starts: one script checks every counter that applies (its key's, its user's, its groups') and,
only if all of them allow it, adds the request, its estimated tokens (prompt + the capped
max_tokens) and its estimated cost to each, atomically. So concurrent requests in any number of
processes cannot together pass a limit: a request is let in only if what is already counted,
reservations included, plus its own estimate fits. The estimates err high (routing.prompt's token
estimate bounds a real tokenizer's count; the cost is the dearest target's, engine time included:
spend.engine_time), and a request reserves at least one micro-unit of money, so a spent budget
refuses it whatever it is priced at. When the answer ends, the reservation settles to what the
engine reported (a stopped or failed stream to its prompt, which the engine took, and what it
produced), in the background and in batches: the settlements of the answers that end within
SETTLE_EVERY travel in one script call, and nothing on an answer's way waits for them.

Leases keep Redis off the answer's way too. A trip to Redis takes, besides the request's own
estimate, a share of each counter for the requests to come (up to LEASE_REQUESTS requests' worth,
at most 1/LEASE_SHARE of the limit, and only what the limit leaves). That share is counted in Redis
like any reservation, so the next requests of the process are admitted against it in memory, with
no trip, and no less exactly: every process admits only what Redis has already counted, so all of
them together can never pass a limit. An answer that used less than it reserved gives the rest
back to the lease; a lease unused for LEASE_IDLE, or whose window is over, or whose limit changed,
goes back to Redis. The price: a process's unused share is counted as used, for up to LEASE_IDLE,
which other processes and the usage endpoint see.

A budget that reroutes (Limit.OverBudget.REROUTE) is never refused here: the pipeline reads it
before it picks a rule (`aover_budget`) and sends the request by the over-budget rules.

Redis unreachable: LIMITS_ON_REDIS_OUTAGE says whether requests with limits are refused (`closed`,
the default: no spend that is not counted) or let through uncounted (`open`); either way the log
and `gateway_spend_unchecked_total` say so.

The parts: `counter` (the counters, their windows and keys, the scripts' runner, the budget
warnings), `leases` (a loop's shares, and a request's Reservation), `reservations` (areserve),
`settlement` (settle_soon, lease returns, the batched moves), `reads` (the Standing after a
reservation, the over-budget read, the usage readings) and `refusals` (a refusal's words, Redis
outages).
"""

# The ledger's interface, re-exported: what the pipeline, the /v1 raw APIs, the usage endpoint,
# the dashboard and the admin call, under one name (`spend.ledger.areserve`), so that the parts
# above can move without their callers knowing (and LEASE_IDLE, how long an unused share stays
# counted: what a caller waits for to see the counts exact). Tests of a part import the part.
from spend.ledger.counter import MONEY
from spend.ledger.leases import LEASE_IDLE, Reservation
from spend.ledger.reads import Reading, Standing, aover_budget, readings
from spend.ledger.refusals import Refusal, outage_lets_through
from spend.ledger.reservations import areserve
from spend.ledger.settlement import asettled, settle_soon

__all__ = [
    "LEASE_IDLE",
    "MONEY",
    "Reading",
    "Refusal",
    "Reservation",
    "Standing",
    "aover_budget",
    "areserve",
    "asettled",
    "outage_lets_through",
    "readings",
    "settle_soon",
]
