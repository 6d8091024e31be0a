"""Reads of spending: money spent in a period by target, key, user and group (the request log),
and every budget with what is spent of it now (Redis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from observability.selectors.periods import Period
from spend.ledger import MONEY, readings
from spend.models import Limit
from spend.policy import spec_of
from spend.prices import MICROS


@dataclass(frozen=True)
class Spender:
    name: str  # a key ("laptop (alice)"), a user, a group or a target
    cost: float
    requests: int
    tokens_in: int
    tokens_out: int


@dataclass
class Spend:
    by_slot: dict[str, list[float]]  # target -> cost per slot of the period
    total: float
    keys: list[Spender]
    users: list[Spender]
    groups: list[Spender]
    targets: list[Spender]


_SPEND_SLOTS_SQL = """
SELECT date_bin(%(slot)s, at, %(start)s), target, sum(cost)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND cost > 0
GROUP BY 1, 2
"""

# Every spender at once: by key, by user, by target (grouping sets), and by group through the
# users' current groups.
_SPENDERS_SQL = """
SELECT CASE WHEN GROUPING(api_key_id) = 0 THEN 'key'
            WHEN GROUPING(user_id) = 0 THEN 'user' ELSE 'target' END,
       coalesce(api_key_id::text, user_id::text, target), sum(cost), count(*),
       coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0)
FROM chat_requestlog
WHERE at >= %(start)s AND at < %(end)s AND cost > 0
GROUP BY GROUPING SETS ((api_key_id), (user_id), (target))
UNION ALL
SELECT 'group', g.name, sum(r.cost), count(*),
       coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.completion_tokens), 0)
FROM chat_requestlog r
JOIN auth_user_groups ug ON ug.user_id = r.user_id
JOIN auth_group g ON g.id = ug.group_id
WHERE r.at >= %(start)s AND r.at < %(end)s AND r.cost > 0
GROUP BY g.name
"""

_SPENDER_NAMES_SQL = """
SELECT 'key', k.id::text, k.name || ' (' || u.username || ')'
FROM chat_apikey k JOIN auth_user u ON u.id = k.user_id WHERE k.id = ANY(%(keys)s)
UNION ALL
SELECT 'user', u.id::text, u.username FROM auth_user u WHERE u.id = ANY(%(users)s)
"""


def spend(period: Period, *, top: int = 10) -> Spend:
    """Money spent in the period (the request log's cost, by the endpoints' prices): per target
    over time, in total, and the top spenders by API key, user, group and target."""
    by_slot: dict[str, list[float]] = {}
    index = {at: i for i, at in enumerate(period.slots)}
    found: dict[str, list[tuple]] = {"key": [], "user": [], "group": [], "target": []}
    params: dict[str, Any] = {"slot": period.slot, "start": period.start, "end": period.end}
    with connection.cursor() as cursor:
        cursor.execute(_SPEND_SLOTS_SQL, params)
        for at, target, cost in cursor.fetchall():
            by_slot.setdefault(target or "", [0.0] * len(index))[index[at]] += cost
        cursor.execute(_SPENDERS_SQL, params)
        for kind, ident, cost, requests, tokens_in, tokens_out in cursor.fetchall():
            if ident is not None:
                found[kind].append((ident, cost, requests, tokens_in, tokens_out))
        total = sum(row[1] for row in found["target"])
        for kind in found:
            found[kind] = sorted(found[kind], key=lambda row: -row[1])[:top]
        cursor.execute(
            _SPENDER_NAMES_SQL,
            {
                "keys": [int(row[0]) for row in found["key"]],
                "users": [int(row[0]) for row in found["user"]],
            },
        )
        names = {(kind, ident): name for kind, ident, name in cursor.fetchall()}

    def spenders(kind: str) -> list[Spender]:
        return [
            Spender(
                names.get((kind, ident), f"#{ident} (deleted)")
                if kind in ("key", "user")
                else ident,
                cost,
                requests,
                tokens_in,
                tokens_out,
            )
            for ident, cost, requests, tokens_in, tokens_out in found[kind]
        ]

    return Spend(
        by_slot=by_slot,
        total=total,
        keys=spenders("key"),
        users=spenders("user"),
        groups=spenders("group"),
        targets=spenders("target"),
    )


@dataclass(frozen=True)
class BudgetState:
    whose: str
    kind: str  # key | user | group
    spent: float
    budget: float
    period: str
    warn_at: float
    over_budget: str  # what a request meets once it is spent: refuse | reroute
    limit_id: int

    @property
    def share(self) -> float:
        return self.spent / self.budget if self.budget else 1.0

    @property
    def state(self) -> str:
        """ok, warn (past the warning share: the soft budget) or spent (the hard budget)."""
        if self.share >= 1:
            return "spent"
        return "warn" if self.share >= self.warn_at else "ok"


def budgets() -> list[BudgetState]:
    """Every budget with what is spent of it in its current period (Redis, where it is counted),
    fullest first."""
    rows = list(
        Limit.objects.filter(budget__isnull=False).select_related("api_key__user", "user", "group")
    )
    specs = [spec_of(row) for row in rows]
    spent = {r.spec.subject: r.used for r in readings(tuple(specs)) if r.unit == MONEY}
    states = [
        BudgetState(
            whose=row.subject_label,
            kind=spec.kind,
            spent=spent.get(spec.subject, 0) / MICROS,
            budget=float(row.budget),  # type: ignore[arg-type]  # budget__isnull=False
            period=row.budget_period,
            warn_at=row.warn_at,
            over_budget=row.over_budget,
            limit_id=row.pk,
        )
        for row, spec in zip(rows, specs, strict=True)
    ]
    return sorted(states, key=lambda b: -b.share)
