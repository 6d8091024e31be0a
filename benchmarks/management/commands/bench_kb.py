"""Benchmark the KB's direct-answer road on a synthetic KB in its own database.

    python manage.py bench_kb [--entries 10000] [--queries 300] [--concurrency 16] [--no-http]
                              [--rebuild] [--no-keep] [--embedding-threads N]

Works in `bench_<database>` on the configured server, never in the developer's data;
a second run with the same --entries reuses the KB. Prints the build time, latency per
query class (exact hit, vector hit, miss) in process and over HTTP through a real
daphne, where one call's time goes, the pgvector query alone with its plan, and the
targets. A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, kb, kb_data, kb_pgvector, servers, stack, stats
from knowledge.embedding import embed_texts, query_cache, spec_of
from knowledge.models import Entry, Passage, PassageVector, Phrasing, PhrasingVector
from knowledge.selectors import direct_answer, serving_model_forget
from knowledge.services.vectors import (
    embedding_model_ensure,
    embedding_model_index_ensure,
    missing_vectors_embed,
)

TARGETS = (
    # (class, where, concurrency, p50 limit in ms)
    ("exact hit", "in-process", 1, 2.0),
    ("vector hit", "HTTP", 1, 15.0),
    ("pgvector top-40", "postgres", 1, 2.0),
)
WARMUP = 20


class Command(BaseCommand):
    help = (
        "Benchmark the KB direct-answer road (exact, vector, miss) in process and over HTTP, "
        "in bench_<db>."
    )
    # Checks may connect to the database; nothing may connect before we point at the bench database.
    requires_system_checks = []

    def add_arguments(self, parser):
        arguments.synthetic_kb_add(
            parser, minimum=1, default=10_000, capacity=kb_data.faq_capacity()
        )
        parser.add_argument(
            "--queries", type=int, default=300, help="queries per class (default 300)"
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=16,
            help="threads of the concurrent runs (default 16)",
        )
        parser.add_argument(
            "--http",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also measure GET /api/kb/answer through a real daphne (default on)",
        )
        parser.add_argument(
            "--http-auth",
            choices=("key", "session"),
            default="key",
            help="how the HTTP client authenticates: an API key with the kb scope, as an "
            "integration does (default), or a staff session cookie, as a browser does",
        )
        arguments.keep_add(parser)
        parser.add_argument(
            "--rebuild", action="store_true", help="rebuild the KB even if it matches"
        )
        parser.add_argument(
            "--seed", type=int, default=7, help="seed of the query sets (default 7)"
        )
        parser.add_argument(
            "--embedding-threads",
            type=int,
            default=None,
            help="threads per call of the local embedding model, here and in daphne "
            "(KB_EMBEDDING_THREADS); default: the setting, as served",
        )

    def handle(
        self,
        *args,
        entries,
        queries,
        concurrency,
        http,
        keep,
        rebuild,
        seed,
        embedding_threads,
        http_auth,
        **options,
    ):
        if not 1 <= entries <= kb_data.faq_capacity():
            raise CommandError(f"--entries must be between 1 and {kb_data.faq_capacity()}")
        if queries < 10 or concurrency < 1:
            raise CommandError("--queries must be at least 10 and --concurrency at least 1")
        name = f"bench_{settings.DATABASES['default']['NAME']}"
        try:
            with stack.stack_session(drop=None if keep else name, say=self.out):
                created = stack.database_prepare(name=name, pool_size=concurrency + 2)
                self.out(
                    f"database {name} ({'created' if created else 'existing'}) on "
                    f"{settings.DATABASES['default']['HOST'] or 'localhost'}: "
                    f"{kb_pgvector.server_versions()}"
                )
                self.out(
                    f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
                    "(other work on this machine shows up in every figure)"
                )
                self.bench(
                    name=name,
                    entries=entries,
                    queries=queries,
                    concurrency=concurrency,
                    http=http,
                    rebuild=rebuild,
                    seed=seed,
                    embedding_threads=embedding_threads,
                    http_auth=http_auth,
                )
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; daphne, if started, was stopped", returncode=130
            ) from None

    def out(self, text: str = "", ending: str = "\n") -> None:
        self.stdout.write(text, ending=ending)
        self.stdout.flush()

    # --- the run -------------------------------------------------------------------------------

    def bench(
        self,
        *,
        name,
        entries,
        queries,
        concurrency,
        http,
        rebuild,
        seed,
        embedding_threads,
        http_auth,
    ):
        if embedding_threads is not None:
            settings.KB_EMBEDDING_THREADS = (
                embedding_threads  # before the model loads in this process
            )
        model = embedding_model_ensure()
        serving_model_forget()
        spec = spec_of(model)
        self.build(entries=entries, rebuild=rebuild, model=model)
        local = spec.backend == "local"
        if local:
            threads = kb.embedding_threads(embedding_threads)
            self.out(
                f"embedding model {spec.name}: runtime {settings.KB_EMBEDDING_RUNTIME}, "
                f"{threads or 'the runtime’s default'} thread(s) per call"
            )

        rng = random.Random(seed)
        specs = kb_data.faq_specs(entries)
        pk_of = dict(Entry.objects.filter(kind=Entry.Kind.FAQ).values_list("question", "pk"))
        off_domain = kb_data.off_domain_queries(rng)
        warmup, off_domain = off_domain[:WARMUP], off_domain[WARMUP:]
        for question in warmup:  # loads the embedding model and warms the caches
            direct_answer(question)

        exact = [typed for typed, _ in kb_data.exact_queries(specs, queries, rng)]
        vector, miss = self.query_sets(specs, pk_of, off_domain, queries, rng)
        sets = {
            "exact hit": (exact, "exact"),
            "vector hit": (vector, "vector"),
            "miss": (miss, "miss"),
        }

        runs: list[kb.Run] = []
        self.out("\nin-process: knowledge.selectors.direct_answer(q)")
        for label, (texts, _) in sets.items():
            query_cache().clear()
            runs.append(self.in_process(label, texts, 1, variant=0))
            if label == "vector hit":
                # The same strings again: what the query-vector LRU saves on a repeated question.
                runs.append(self.in_process("vector hit (cached repeat)", texts, 1, variant=0))
            query_cache().clear()
            runs.append(self.in_process(label, texts, concurrency, variant=1))
        breakdown = {label: kb.call_breakdown(spec, texts) for label, (texts, _) in sets.items()}
        options = kb.embedding_options(spec, kb_data.spelled(vector, 2)[:100]) if local else []
        nearest_runs, plan_report = self.pgvector(model, spec, (vector + miss)[:queries])
        runs += nearest_runs

        if http:
            self.out(
                "\nHTTP: GET /api/kb/answer through daphne on the bench database, authenticated by "
                f"{'an API key' if http_auth == 'key' else 'a session cookie'} "
                f"(DATABASE_POOL_SIZE={os.environ.get('DATABASE_POOL_SIZE', '10')})"
            )
            runs += self.over_http(name, sets, warmup, concurrency, embedding_threads, http_auth)

        self.report(runs, sets, breakdown, options, plan_report)

    def build(self, *, entries: int, rebuild: bool, model) -> None:
        specs = kb_data.faq_specs(entries)
        extra = kb_data.context_specs(kb_data.context_count(entries))
        if rebuild or not kb_data.kb_matches(specs, len(extra)):
            self.out(
                f"building the KB: {entries} FAQ entries, {len(extra)} rule/document entries ..."
            )
            began = time.perf_counter()
            kb_data.kb_build(specs, extra)
            rows = time.perf_counter() - began
            self.out(f"  rows written in {rows:.1f} s")
        else:
            self.out(
                f"reusing the KB: {entries} FAQ entries, {len(extra)} rule/document entries "
                "(--rebuild to start over)"
            )
        total = (
            Phrasing.objects.exclude(vectors__model=model).count()
            + Passage.objects.exclude(vectors__model=model).count()
        )
        if total:
            began = time.perf_counter()

            def progress(done):
                rate = done / (time.perf_counter() - began)
                self.out(f"  embedding: {done}/{total} texts, {rate:.0f}/s", ending="\r")

            missing_vectors_embed(model=model, batch_size=256, progress=progress)
            self.out(f"\n  embedded {total} texts in {time.perf_counter() - began:.1f} s")
        began = time.perf_counter()
        embedding_model_index_ensure(model=model)  # idempotent; the build relies on it
        kb_data.analyze()
        self.out(f"  index check and ANALYZE in {time.perf_counter() - began:.1f} s")
        indexes = kb_pgvector.hnsw_indexes(model)
        self.out(
            f"KB: {Entry.objects.count()} entries, {Phrasing.objects.count()} phrasings "
            f"({PhrasingVector.objects.filter(model=model).count()} vectors), "
            f"{Passage.objects.count()} passages "
            f"({PassageVector.objects.filter(model=model).count()} vectors); model {model.name}; "
            f"HNSW: {', '.join(f'{n} {size}' for n, size in indexes) or 'NONE'}"
        )

    def query_sets(self, specs, pk_of, off_domain, queries, rng) -> tuple[list[str], list[str]]:
        """Vector hits are whatever paraphrases the vector road actually answers; the rest are
        misses."""
        found = kb_data.paraphrases_classify(
            kb_data.paraphrase_attempts(specs, rng)[: queries * 10], pk_of, queries
        )
        self.out(
            f"\nparaphrases: {found.tried} tried, {len(found.hits)} vector hits "
            f"({100 * len(found.hits) / found.tried:.0f}%; "
            f"{found.right} of them the intended entry), "
            f"{found.exact} exact, {len(found.misses)} misses"
        )
        for reason, count in found.reasons.most_common(4):
            self.out(f"  miss because {reason}: {count}")
        off_hits = [text for text in off_domain if direct_answer(text).hit]
        off_domain = [text for text in off_domain if text not in off_hits]
        if off_hits:
            self.out(f"  {len(off_hits)} off-domain questions hit (left out): {off_hits[:3]}")
        if len(found.hits) < queries:
            self.out(
                f"  only {len(found.hits)} vector hits for {queries} wanted: "
                "the vector class is smaller"
            )
        half = min(len(off_domain), queries // 2)
        return found.hits[:queries], off_domain[:half] + found.misses[: queries - half]

    def in_process(self, label, texts, concurrency, *, variant) -> kb.Run:
        run = kb.Run(label, "in-process", concurrency)
        kb.run_threads(
            run, kb_data.spelled(texts, variant), lambda state, q: kb.outcome_of(direct_answer(q))
        )
        self.progress(run)
        return run

    def progress(self, run: kb.Run) -> None:
        self.out(
            f"  {run.label:<30} c={run.concurrency:<3} n={run.n:<4} p50 {run.ms(0.5):7.2f} ms  "
            f"p99 {run.ms(0.99):7.2f} ms"
            + (f"  ERRORS {sum(run.errors.values())}" if run.errors else "")
        )

    def pgvector(self, model, spec, texts) -> tuple[list[kb.Run], list[str]]:
        vectors = embed_texts(spec, texts)
        nearest = kb_pgvector.nearest_timings(model, vectors)
        for run in nearest.runs:
            self.progress(run)
        plan = kb_pgvector.nearest_plan(model, vectors)
        return nearest.runs, kb_pgvector.plan_report(plan, nearest, queries=len(vectors))

    def over_http(
        self, name, sets, warmup, concurrency, embedding_threads, http_auth
    ) -> list[kb.Run]:
        auth = kb.staff_auth(http_auth)
        env = kb.server_env(name)
        if embedding_threads is not None:
            env["KB_EMBEDDING_THREADS"] = str(embedding_threads)
        runs = []
        with tempfile.TemporaryDirectory(prefix="bench_kb_") as tmp:
            log = Path(tmp) / "daphne.log"
            try:
                with servers.gateway(env=env, log_path=log) as server:
                    port = server.port
                    began = time.perf_counter()
                    # The first request loads the embedding model in the server: a minute at most.
                    first = kb.AnswerClient(port, auth, timeout=120)
                    first.ask(warmup[0])
                    first.close()
                    self.out(
                        f"  daphne on 127.0.0.1:{port}; first request (model load) "
                        f"{time.perf_counter() - began:.1f} s"
                    )
                    client = kb.AnswerClient(port, auth)
                    for question in kb_data.spelled(warmup, 1):
                        client.ask(question)
                    client.close()
                    for label, (texts, _) in sets.items():
                        for conc, variant in ((1, 2), (concurrency, 3)):
                            runs.append(self.http_run(port, auth, label, texts, conc, variant))
            except (RuntimeError, OSError, ValueError) as exc:
                raise CommandError(
                    f"HTTP benchmark failed: {exc}\ndaphne log (tail):\n{servers.log_tail(log)}"
                ) from None
        return runs

    def http_run(self, port, auth, label, texts, concurrency, variant) -> kb.Run:
        run = kb.Run(label, "HTTP", concurrency)
        clients = []

        def open_client():
            client = kb.AnswerClient(port, auth)
            clients.append(client)
            return client

        def ask(client, question):
            body = client.ask(question)
            return body["method"] if body["hit"] else "miss"

        # Fresh spellings per run: the server's query-vector LRU has seen the others.
        kb.run_threads(
            run,
            kb_data.spelled(texts, variant),
            ask,
            open_state=open_client,
            close_state=lambda client: client.close(),
        )
        reconnects = sum(client.reconnects for client in clients)
        if reconnects:
            run.notes.append(
                f"{reconnects} keep-alive connections closed by the server and reopened"
            )
        self.progress(run)
        return run

    # --- the report ----------------------------------------------------------------------------

    def report(self, runs, sets, breakdown, options, plan_report) -> None:
        expected = {label: outcome for label, (_, outcome) in sets.items()}
        expected["vector hit (cached repeat)"] = "vector"
        header = (
            f"{'class':<30} | {'where':<10} | {'conc':>4} | {'n':>4} | "
            f"{'p50 ms':>7} | {'p99 ms':>7} | {'mean ms':>7} | {'req/s':>7} | as expected"
        )
        self.out("\n" + header)
        self.out("-" * len(header))
        for run in runs:
            want = expected.get(run.label)
            agreed = f"{run.outcomes[want]}/{run.n}" if want else ""
            self.out(
                f"{run.label:<30} | {run.where:<10} | {run.concurrency:>4} | {run.n:>4} | "
                f"{run.ms(0.5):>7.2f} | {run.ms(0.99):>7.2f} | {run.mean_ms:>7.2f} | "
                f"{run.rate:>7.1f} | {agreed}"
            )
            for error, count in run.errors.items():
                self.out(f"{'':<30}   ! {count} failed: {error}")
            for note in run.notes:
                self.out(f"{'':<30}   note: {note}")

        self.out("\nwhere one in-process call's time goes (p50 of each part, concurrency 1):")
        for label, parts in breakdown.items():
            total, sql, embedding = (
                1000 * stats.percentile(values, 0.5) if values else 0.0
                for values in (parts.total, parts.sql, parts.embedding)
            )
            statements = stats.percentile(parts.statements, 0.5)
            self.out(
                f"  {label:<11} total {total:6.2f} ms = embedding {embedding:6.2f} "
                f"+ SQL {sql:5.2f} ({statements:.0f} statements) "
                f"+ Python/ORM ~{total - sql - embedding:5.2f}"
            )
        if options:
            self.out(
                "\none-query embedding, other settings of the same model "
                "(turn by turn, same queries):"
            )
            for label, latencies, worst in options:
                self.out(
                    f"  {label:<32} p50 {1000 * stats.percentile(latencies, 0.5):6.2f} ms  "
                    f"p99 {1000 * stats.percentile(latencies, 0.99):6.2f} ms  "
                    f"worst cosine to the served vector {worst:.5f}"
                )
        self.out("")
        for line in plan_report:
            self.out(line)

        self.out(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
        self.out("targets:")
        for label, where, conc, limit in TARGETS:
            run = next(
                (r for r in runs if (r.label, r.where, r.concurrency) == (label, where, conc)), None
            )
            if run is None:
                self.out(f"  {label} p50 ≤ {limit:g} ms ({where}): not measured")
                continue
            verdict = "met" if run.ms(0.5) <= limit else "MISSED"
            self.out(
                f"  {label} p50 ≤ {limit:g} ms ({where}, c={conc}): "
                f"{run.ms(0.5):.2f} ms — {verdict}"
            )
