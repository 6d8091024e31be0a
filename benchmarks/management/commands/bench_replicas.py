"""Benchmark replica picking: three simulator replicas of unequal speed behind one replica group,
the gateway picking the least busy against plain round-robin.

    python manage.py bench_replicas [--concurrency 32] [--requests 256] [--max-tokens 64]
                                    [--rounds 2] [--modes least_busy,round_robin,queue_only]
                                    [--check-interval 1] [--web-concurrency N]

Each run starts its own stack (a database of its own, the demo KB and routing, the gateway with
production settings): the demo's `local` endpoint and two more, all in the group `pool`, on three
simulators that differ in speed and batch size (the fast one decodes at 10 ms a token, 48 at a
time; the slow one at 40 ms, 8 at a time, so work sent to it waits). A thread here stands in for
the beat: it checks the three endpoints every `--check-interval` seconds (1; production's beat
every ENGINE_CHECK_INTERVAL, 5), as `endpoints_check_all` does, so the gateway sees their
gauges. The modes alternate, `--rounds` times each. Per run: TTFT p50 and p99, output tokens/s,
and the share of the requests each replica served (its own counter).
A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import servers
from benchmarks.loadgen import BenchError, Level, LoadOptions, Target
from benchmarks.loadgen_rounds import benchmark_run
from benchmarks.prompts import prompts_builtin
from benchmarks.stack import MODEL, StackError, stack_run, stack_session
from benchmarks.users import bench_api_key

# name -> (inter-token latency ms, sequences decoded at once): unequal on purpose.
REPLICAS = {"local": (10, 48), "local-b": (20, 24), "local-c": (40, 8)}
# mode -> the gateway's settings for it. queue_only: the least-busy pick by queues and this
# process's streams alone (running requests and KV-cache use weigh nothing), for comparison.
MODES = {
    "least_busy": {},
    "round_robin": {"ROUTING_REPLICA_PICK": "round_robin"},
    "queue_only": {"ROUTING_RUNNING_WEIGHT": "0", "ROUTING_KV_WEIGHT": "0"},
}


def _served(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


class Command(BaseCommand):
    help = (
        "Benchmark the least-busy replica pick against round-robin, "
        "three simulators of unequal speed."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=32)
        parser.add_argument("--requests", type=int, default=256, help="per run")
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating")
        parser.add_argument(
            "--ttft", type=float, default=100.0, help="the simulators' time to first token, ms"
        )
        parser.add_argument(
            "--check-interval",
            type=float,
            default=1.0,
            help=(
                "seconds between the health checks of the replicas "
                "(production: ENGINE_CHECK_INTERVAL, 5)"
            ),
        )
        parser.add_argument(
            "--web-concurrency",
            type=int,
            default=None,
            help="daphne processes of the gateway, through config.web (default: one, directly)",
        )
        parser.add_argument(
            "--modes",
            default="least_busy,round_robin",
            help=f"comma-separated, run in turn each round: {', '.join(MODES)}",
        )

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        modes = [m.strip() for m in o["modes"].split(",") if m.strip()]
        if not modes or set(modes) - set(MODES):
            raise CommandError(f"--modes: choose from {', '.join(MODES)}")
        name = f"bench_replicas_{settings.DATABASES['default']['NAME']}"
        load = os.getloadavg()
        self.out(
            f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at the start; "
            "replicas (ITL ms, max-num-seqs): "
            + ", ".join(f"{n} {itl}/{seqs}" for n, (itl, seqs) in REPLICAS.items())
        )
        rows = []
        try:
            with stack_session(drop=name, say=self.out):
                for round_number in range(o["rounds"]):
                    order = modes if round_number % 2 == 0 else modes[::-1]
                    for mode in order:
                        rows.append(self.run(name=name, mode=mode, o=o))
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None
        except (StackError, BenchError) as exc:
            raise CommandError(str(exc)) from None
        self.out(
            "\nmode          TTFT p50    p99 ms   tok/s  failed  served by " + " / ".join(REPLICAS)
        )
        for mode, metrics, shares in rows:
            self.out(
                f"{mode:12} {metrics['median_ttft_ms']:9.1f} {metrics['p99_ttft_ms']:9.1f} "
                f"{metrics['output_throughput']:7.0f} {metrics['failed']:7}  "
                + " / ".join(f"{share:.0%}" for share in shares)
            )

    def run(self, *, name: str, mode: str, o: dict):
        with contextlib.ExitStack() as stack:
            urls = {}
            for replica, (itl, seqs) in list(REPLICAS.items())[1:]:
                urls[replica] = stack.enter_context(
                    servers.simulator(
                        model=MODEL,
                        args=[
                            "--max-num-seqs",
                            str(seqs),
                            "--time-to-first-token",
                            str(o["ttft"]),
                            "--inter-token-latency",
                            str(itl),
                            "--seed",
                            "0",
                        ],
                    )
                )
            itl, seqs = REPLICAS["local"]
            sim_args = [
                "--max-num-seqs",
                str(seqs),
                "--time-to-first-token",
                str(o["ttft"]),
                "--inter-token-latency",
                str(itl),
                "--seed",
                "0",
            ]
            run = stack.enter_context(
                stack_run(
                    name=name,
                    sim_args=sim_args,
                    setup=lambda: self.group(urls),
                    gateway_extra={
                        **MODES[mode],
                        "CHAT_RATE_LIMIT": "1000000",
                        "CHAT_MAX_STREAMS_PER_USER": "1000000",
                        "ROUTING_LOAD_SECONDS": "0.5",
                    },
                    local_max_concurrency=max(o["concurrency"], 2),
                    web_concurrency=o["web_concurrency"],
                )
            )
            urls["local"] = run.simulator_url
            stop = threading.Event()
            checker = threading.Thread(
                target=self.check, args=(stop, o["check_interval"]), daemon=True
            )
            checker.start()
            before = [_served(urls[r]) for r in REPLICAS]
            try:
                report = asyncio.run(
                    benchmark_run(
                        targets=[
                            Target(
                                base_url=f"{run.gateway.url}/v1",
                                api_key=bench_api_key(
                                    username="bench-replicas", name="bench_replicas"
                                ),
                                model="auto",
                                name=mode,
                            )
                        ],
                        levels=[Level(concurrency=o["concurrency"])],
                        prompts=prompts_builtin(name="chat"),
                        options=LoadOptions(
                            max_tokens=o["max_tokens"],
                            num_requests=o["requests"],
                            ignore_eos=True,
                            progress=False,
                        ),
                    )
                )
            finally:
                stop.set()
                checker.join(timeout=10)
            served = [_served(urls[r]) - b for r, b in zip(REPLICAS, before, strict=True)]
        metrics = report["summary"][0]
        total = sum(served) or 1
        self.out(
            f"{mode}: TTFT p50 {metrics['median_ttft_ms']:.1f} "
            f"p99 {metrics['p99_ttft_ms']:.1f} ms, "
            f"{metrics['output_throughput']:.0f} tok/s, {metrics['failed']} failed"
        )
        return mode, metrics, [s / total for s in served]

    def group(self, urls: dict[str, str]) -> None:
        """The demo's `local` endpoint and two like it on the other simulators, one replica
        group."""
        from inference_ops.models import ModelEndpoint

        local = ModelEndpoint.objects.get(name="local")
        local.replica_group = "pool"
        local.save()
        for replica, url in urls.items():
            ModelEndpoint.objects.update_or_create(
                name=replica,
                defaults={
                    "kind": local.kind,
                    "base_url": f"{url}/v1",
                    "model": local.model,
                    "replica_group": "pool",
                    "max_concurrency": local.max_concurrency,
                    "context_window": local.context_window,
                },
            )

    def check(self, stop: threading.Event, interval: float) -> None:
        from django.db import connection

        from inference_ops.endpoint_checks import endpoint_check
        from inference_ops.models import ModelEndpoint

        ids = list(ModelEndpoint.objects.filter(replica_group="pool").values_list("pk", flat=True))
        while not stop.wait(interval):
            for endpoint_id in ids:
                endpoint_check(endpoint_id=endpoint_id)
        connection.close()
