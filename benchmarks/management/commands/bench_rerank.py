"""What the reranker (knowledge.rerank) adds to a KB vector hit: adirect_answer with it and without.

    python manage.py bench_rerank [--entries 300] [--queries 150] [--rounds 3] [--reranker-ms 0]
                                  [--threshold T --margin M]

In `bench_rerank_<database>` on the configured server, never the developer's data (dropped at the
end): a synthetic KB of --entries FAQ entries embedded by the configured model, the paraphrases the
vector road answers (the vector hits; --threshold and --margin set its operating point as
KB_DIRECT_THRESHOLD and KB_DIRECT_MARGIN do, and a strict one leaves few to measure), and the vLLM
simulator serving BAAI/bge-reranker-v2-m3 on loopback, its forward pass simulated as --reranker-ms.
Each question is asked with the reranker off and on, in turn (which goes first alternates), on one
event loop inside core.db.unbound as the gateway's /v1 API asks: once embedded afresh ("cold": what
a new question costs) and once with its vector from the LRU ("warm": the verdict road alone, where
the stage's cost shows plainest). The simulator's relevance reads words, so its verdicts say
nothing of a real reranker's quality: the figure is the time. Not a test: nothing here passes or
fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, kb_data, servers, stack, stats
from core import db
from knowledge.embedding import query_cache
from knowledge.models import Entry
from knowledge.rerank import arerank_close
from knowledge.selectors import adirect_answer, serving_model_forget
from knowledge.services.vectors import (
    embedding_model_ensure,
    embedding_model_index_ensure,
    missing_vectors_embed,
)

RERANKER = "BAAI/bge-reranker-v2-m3"
VARIANTS = ("off", "on")
TEMPERATURES = ("cold", "warm")
WARMUP = 10


class Command(BaseCommand):
    help = (
        "Latency of adirect_answer on KB vector hits with the reranker and without, "
        "in bench_rerank_<db>."
    )
    # Checks may connect to the database; nothing may connect before we point at the bench database.
    requires_system_checks = []

    def add_arguments(self, parser):
        arguments.synthetic_kb_add(parser, minimum=20, default=300, capacity=kb_data.faq_capacity())
        parser.add_argument(
            "--queries", type=int, default=150, help="vector-hit questions wanted (default 150)"
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=3,
            help="times each question is asked per variant (default 3)",
        )
        parser.add_argument(
            "--reranker-ms",
            type=float,
            default=0.0,
            help="the simulated reranker's forward pass in milliseconds (default 0: the stage's "
            "own cost, HTTP and all)",
        )
        parser.add_argument(
            "--threshold",
            type=float,
            default=None,
            help="the vector road's threshold (KB_DIRECT_THRESHOLD; default: the model's)",
        )
        parser.add_argument(
            "--margin",
            type=float,
            default=None,
            help="the vector road's margin (KB_DIRECT_MARGIN; default: the model's)",
        )
        parser.add_argument(
            "--seed", type=int, default=7, help="seed of the question set (default 7)"
        )

    def handle(
        self, *args, entries, queries, rounds, reranker_ms, threshold, margin, seed, **options
    ):
        if not 20 <= entries <= kb_data.faq_capacity():
            raise CommandError(f"--entries must be between 20 and {kb_data.faq_capacity()}")
        if queries < 10 or rounds < 1 or reranker_ms < 0:
            raise CommandError(
                "--queries must be at least 10, --rounds at least 1, --reranker-ms not negative"
            )
        name = f"bench_rerank_{settings.DATABASES['default']['NAME']}"
        try:
            with stack.stack_session(drop=name, say=self.out):
                stack.database_prepare(name=name, pool_size=4)
                self.out(
                    f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
                    "(other work on this machine shows up in every figure)"
                )
                logging.getLogger("httpx2").setLevel(
                    logging.WARNING
                )  # a line per request otherwise
                settings.KB_RERANK_BASE_URL = ""  # the vector hits are the vector road's own
                if threshold is not None:
                    settings.KB_DIRECT_THRESHOLD = threshold
                if margin is not None:
                    settings.KB_DIRECT_MARGIN = margin
                hits = self.build(entries=entries, queries=queries, seed=seed)
                with servers.simulator(
                    model=RERANKER, args=["--time-to-first-token", f"{reranker_ms:g}"]
                ) as url:
                    settings.KB_RERANK_MODEL = RERANKER
                    times, outcomes = asyncio.run(self.measure(hits, url=url, rounds=rounds))
                self.report(times, outcomes, hits=hits, rounds=rounds, reranker_ms=reranker_ms)
        except KeyboardInterrupt:
            raise CommandError("interrupted; the simulator was stopped", returncode=130) from None

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def build(self, *, entries: int, queries: int, seed: int) -> list[str]:
        model = embedding_model_ensure()
        serving_model_forget()
        specs = kb_data.faq_specs(entries)
        began = time.perf_counter()
        kb_data.kb_build(specs, [])
        missing_vectors_embed(model=model, batch_size=256)
        embedding_model_index_ensure(model=model)
        kb_data.analyze()
        self.out(
            f"KB: {entries} FAQ entries embedded by {model.name} "
            f"in {time.perf_counter() - began:.1f} s "
            f"(threshold {model.threshold:.2f}, margin {model.margin:.2f})"
        )
        pk_of = dict(Entry.objects.filter(kind=Entry.Kind.FAQ).values_list("question", "pk"))
        found = kb_data.paraphrases_classify(
            kb_data.paraphrase_attempts(specs, random.Random(seed)), pk_of, queries
        )
        hits = found.hits[:queries]
        self.out(f"vector hits: {len(hits)} of {found.tried} paraphrases tried")
        if len(hits) < 10:
            raise CommandError(
                "fewer than 10 vector hits: try more --entries, or a lower --threshold"
            )
        return hits

    async def measure(self, hits: list[str], *, url: str, rounds: int):
        times: dict[tuple[str, str], list[float]] = {
            (v, t): [] for v in VARIANTS for t in TEMPERATURES
        }
        outcomes: Counter = Counter()
        urls = {"off": "", "on": url}
        with db.unbound():
            for question in hits[:WARMUP]:  # the model, the pools, the reranker's connection
                for variant in VARIANTS:
                    settings.KB_RERANK_BASE_URL = urls[variant]
                    await adirect_answer(question)
            for round_ in range(rounds):
                for i, question in enumerate(hits):
                    for variant in VARIANTS if (i + round_) % 2 == 0 else VARIANTS[::-1]:
                        settings.KB_RERANK_BASE_URL = urls[variant]
                        for temperature in TEMPERATURES:
                            if temperature == "cold":
                                query_cache().clear()
                            started = time.perf_counter()
                            verdict = await adirect_answer(question)
                            times[(variant, temperature)].append(time.perf_counter() - started)
                            if round_ == 0 and variant == "on" and temperature == "warm":
                                outcomes[_outcome(verdict)] += 1
            settings.KB_RERANK_BASE_URL = url
            await arerank_close()
        settings.KB_RERANK_BASE_URL = ""
        return times, outcomes

    def report(
        self, times, outcomes: Counter, *, hits: list[str], rounds: int, reranker_ms: float
    ) -> None:
        self.out(
            f"\nadirect_answer on {len(hits)} vector hits, {rounds} round(s) each, concurrency 1; "
            f"simulated reranker forward pass {reranker_ms:g} ms"
        )
        self.out(f"{'':<38}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}")
        for temperature, label in (
            ("cold", "embedded afresh (cold)"),
            ("warm", "vector from the LRU (warm)"),
        ):
            figures = {}
            for variant in VARIANTS:
                values = [1000 * t for t in times[(variant, temperature)]]
                figures[variant] = (
                    stats.percentile(values, 0.5),
                    stats.percentile(values, 0.95),
                    sum(values) / len(values),
                )
                self.out(
                    f"{label if variant == 'off' else '':<28}reranker {variant:<3}"
                    + "".join(f"{value:9.2f}" for value in figures[variant])
                )
            added = [on - off for on, off in zip(figures["on"], figures["off"])]
            self.out(f"{'':<28}{'added':<12}" + "".join(f"{value:+9.2f}" for value in added))
        self.out(
            "\nthe reranker's verdicts on the vector hits "
            "(the simulator's lexical relevance, not a model's): "
            + ", ".join(f"{count} {what}" for what, count in outcomes.most_common())
        )


def _outcome(verdict) -> str:
    if verdict.method != "rerank":
        return f"not asked ({verdict.method})"
    if verdict.hit:
        return "answered"
    return "failed" if verdict.reason.startswith("the reranker failed") else "refused"
