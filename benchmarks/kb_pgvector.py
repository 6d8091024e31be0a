"""The KB benchmark's pgvector part: the phrasing query of `knowledge.selectors._nearest` timed
as served, with a wider HNSW search and with no index (recall against the exact scan), its plan
under EXPLAIN ANALYZE, and the HNSW indexes and server versions the figures depend on."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction

from benchmarks.kb import Run
from benchmarks.stats import percentile
from knowledge.models import EmbeddingModel
from knowledge.selectors import _nearest, faq_matches

PHRASINGS = ("knowledge_phrasingvector", "phrasing")


@dataclass
class Nearest:
    runs: list[
        Run
    ]  # as the product calls it, its whole statement, a wider HNSW search, no index at all
    recall: dict[
        str, tuple[float, float]
    ]  # run label -> (recall@1, recall@10) against the exact scan


WIDER_EF_SEARCH = 100


def nearest_timings(model: EmbeddingModel, vectors) -> Nearest:
    """`_nearest` as served, the whole vector-match statement around it, the scan with
    hnsw.ef_search raised, and with index scans off (the exact answer)."""
    settings_of = {
        "pgvector top-40": (),
        f"pgvector top-40, ef_search={WIDER_EF_SEARCH}": (
            f"SET LOCAL hnsw.ef_search = {WIDER_EF_SEARCH}",
        ),
        "pgvector top-40, no index": ("SET LOCAL enable_indexscan = off",),
    }
    runs, found = [], {}
    for label, statements in settings_of.items():
        run = Run(label, "postgres", 1)
        found[label] = []
        for vector in vectors:
            began = time.perf_counter()
            if statements:
                rows = with_settings(
                    statements, lambda vector=vector: _nearest(*PHRASINGS, model, vector, 40)
                )
            else:
                rows = _nearest(*PHRASINGS, model, vector, 40)
            run.latencies.append(time.perf_counter() - began)
            found[label].append([pid for pid, _ in rows])
        run.wall = sum(run.latencies)
        runs.append(run)
    # The statement the vector road sends: the same index scan, joined to phrasings and entries.
    run = Run("faq match statement", "postgres", 1)
    for vector in vectors:
        began = time.perf_counter()
        faq_matches("", model=model, vector=vector)
        run.latencies.append(time.perf_counter() - began)
    run.wall = sum(run.latencies)
    runs.insert(1, run)
    exact = found["pgvector top-40, no index"]
    recall = {}
    for label, ids in found.items():
        pairs = list(zip(ids, exact))
        recall[label] = (
            sum(a[:1] == b[:1] for a, b in pairs) / len(pairs),
            sum(len(set(a[:10]) & set(b[:10])) for a, b in pairs) / (10 * len(pairs)),
        )
    return Nearest(runs=runs, recall=recall)


@dataclass
class Plan:
    text: str
    index_used: bool
    executions: list[float]  # server-side execution times of several such queries, seconds
    ef_search: str
    forced: str = (
        ""  # the HNSW plan with the alternatives switched off, when the planner chose another
    )


def nearest_plan(model: EmbeddingModel, vectors) -> Plan:
    """EXPLAIN ANALYZE of the exact statement `_nearest` sends, captured on its way out."""
    statements = [
        captured_sql(lambda vector=vector: _nearest(*PHRASINGS, model, vector, 40))[0]
        for vector in vectors[:30]
    ]
    plans = [explain(sql, params) for sql, params in statements]
    executions = [
        float(m.group(1)) / 1000
        for p in plans
        if (m := re.search(r"Execution Time: ([\d.]+) ms", p))
    ]
    ef_search = "?"
    with contextlib.suppress(Exception), connection.cursor() as cursor:
        # Known only once pgvector is loaded in this session, which the queries above did.
        cursor.execute("SHOW hnsw.ef_search")
        ef_search = cursor.fetchone()[0]
    plan = Plan(
        text=plans[0],
        index_used="hnsw" in plans[0].lower(),
        executions=executions,
        ef_search=ef_search,
    )
    if not plan.index_used:
        # Without a sequential scan the planner would still sort a btree scan; with neither, only
        # the HNSW path is left, and its estimated cost shows why the planner passed it over.
        plan.forced = explain(
            *statements[0],
            settings_sql=("SET LOCAL enable_seqscan = off", "SET LOCAL enable_sort = off"),
        )
    return plan


def plan_report(plan: Plan, nearest: Nearest, *, queries: int) -> list[str]:
    """The plan, the server-side times and the recall against the exact scan, as printed."""
    ms = lambda p: 1000 * percentile(plan.executions, p)  # noqa: E731
    report = [
        "EXPLAIN (ANALYZE, BUFFERS) of the phrasing query of knowledge.selectors._nearest:",
        *("  " + line for line in elide_vectors(plan.text).splitlines()),
        f"HNSW index used: {'yes' if plan.index_used else 'NO'}; "
        f"hnsw.ef_search = {plan.ef_search}; "
        f"server-side execution p50 {ms(0.5):.2f} ms, p99 {ms(0.99):.2f} ms "
        f"over {len(plan.executions)} queries",
        *(
            f"{label} vs the exact scan: recall@1 {at1:.3f}, recall@10 {at10:.3f} "
            f"over {queries} queries"
            + ("" if plan.index_used else " (meaningless here: the planner used no HNSW scan)")
            for label, (at1, at10) in nearest.recall.items()
            if "no index" not in label
        ),
    ]
    if plan.forced:
        report += [
            "The planner chose an exact scan. "
            "The HNSW path, forced (enable_seqscan, enable_sort off):",
            *("  " + line for line in elide_vectors(plan.forced).splitlines()),
        ]
    return report


def elide_vectors(plan: str) -> str:
    return re.sub(r"'\[[^']{40,}\]'", "'[…vector…]'", plan)


def captured_sql(call: Callable[[], object]) -> list[tuple[str, object]]:
    """The SQL statements (with parameters) that `call` runs on this thread's connection."""
    statements = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        call()
    return statements


def explain(sql: str, params, *, analyze: bool = True, settings_sql: tuple[str, ...] = ()) -> str:
    """EXPLAIN of one statement; `settings_sql` (SET LOCAL ...) applies to this statement only."""
    options = "ANALYZE, BUFFERS" if analyze else "COSTS"
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in settings_sql:
            cursor.execute(statement)
        cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def with_settings(settings_sql: tuple[str, ...], call: Callable[[], object]):
    with transaction.atomic():
        with connection.cursor() as cursor:
            for statement in settings_sql:
                cursor.execute(statement)
        return call()


def hnsw_indexes(model: EmbeddingModel) -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, "
            "pg_size_pretty(pg_relation_size(format('%%I', indexname)::regclass)) "
            "FROM pg_indexes "
            "WHERE tablename IN ('knowledge_phrasingvector', 'knowledge_passagevector') "
            "AND indexdef ILIKE '%%USING hnsw%%' AND indexname LIKE %s ORDER BY indexname",
            [f"%_hnsw_m{int(model.pk)}"],
        )
        return cursor.fetchall()


def server_versions() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('server_version'), "
            "(SELECT extversion FROM pg_extension WHERE extname = 'vector')"
        )
        postgres, pgvector = cursor.fetchone()
    return f"PostgreSQL {postgres}, pgvector {pgvector}"
