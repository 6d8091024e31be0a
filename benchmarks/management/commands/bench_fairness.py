"""Fair share at the engine's capacity: does one busy tenant make everyone queue?

    python manage.py bench_fairness [--streams 48] [--max-num-seqs 16] [--seconds 40]
        [--long-tokens 256] [--short-tokens 16] [--ttft 100] [--itl 20] [--processes 2]
        [--engine simulator|vllm]

Each run starts its own stack (a database of its own, the demo data, the simulator as the engine
with `--max-num-seqs` sequences decoded at once, the gateway with `--processes` daphne processes
and Redis keys of its own) three times, once per mode:

- alone: the quiet tenant by itself (one short question at a time through /v1, with a key of its
  own), the demo's `local` endpoint without a capacity (today's code);
- off: beside the noisy tenant (`--streams` long streams at once through /v1, refilled as they
  end), no capacity: every request goes to the engine, which queues what it cannot decode;
- on: the same, the endpoint's capacity set to `--max-num-seqs` (inference_ops.admission): the
  requests past it wait in the gateway, in fair-share order.

Per mode: the quiet tenant's TTFT p50/p99 (what its client sees), the engine's output tokens per
second (its own counter) while the quiet tenant asks, and the noisy tenant's requests: started,
completed, failed (the ones still going when the quiet tenant stops are waited for). The issue's
targets: quiet p99 with admission ≤ 2× alone, throughput ≥ 0.95× of off, no noisy request lost.
Figures, not a test: the machine is shared, so quote several runs. `--engine vllm`: the real vLLM
(the bundled model, from an engine row's argv with `--max-num-seqs`) instead of the simulator;
--ttft and --itl are then its own.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import engine, fairness
from benchmarks.engines import bundled_vllm_fields
from benchmarks.stack import StackError, stack_run, stack_session
from benchmarks.stats import percentile
from benchmarks.users import bench_api_key

MODES = ("alone", "off", "on")


class Command(BaseCommand):
    help = "Measure a quiet tenant's TTFT beside a noisy one, with and without fair admission."

    def add_arguments(self, parser):
        parser.add_argument("--streams", type=int, default=48, help="the noisy tenant's streams")
        parser.add_argument("--max-num-seqs", type=int, default=16)
        parser.add_argument("--seconds", type=float, default=40.0, help="per mode")
        parser.add_argument("--warmup", type=float, default=5.0)
        parser.add_argument("--long-tokens", type=int, default=256)
        parser.add_argument("--short-tokens", type=int, default=16)
        parser.add_argument("--ttft", type=float, default=100.0, help="the simulator's, ms")
        parser.add_argument("--itl", type=float, default=20.0, help="the simulator's, ms")
        parser.add_argument("--processes", type=int, default=2, help="daphne processes")
        parser.add_argument("--engine", choices=("simulator", "vllm"), default="simulator")
        parser.add_argument("--modes", default=",".join(MODES))
        parser.add_argument("--log-dir", type=Path, help="keep the processes' logs there")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
        modes = [m.strip() for m in o["modes"].split(",") if m.strip()]
        if not modes or set(modes) - set(MODES):
            raise CommandError(f"--modes: a comma-separated list of {', '.join(MODES)}")
        if min(o["streams"], o["max_num_seqs"], o["processes"]) < 1 or o["seconds"] <= 0:
            raise CommandError("--streams, --max-num-seqs, --processes and --seconds must be > 0")
        name = f"bench_fairness_{settings.DATABASES['default']['NAME']}"
        timing = (
            f"TTFT {o['ttft']:g} ms, ITL {o['itl']:g} ms"
            if o["engine"] == "simulator"
            else "its own"
        )
        self.out(
            f"{o['engine']}: max-num-seqs {o['max_num_seqs']}, {timing}; noisy: {o['streams']} "
            f"streams of {o['long_tokens']} tokens; quiet: "
            f"one question of {o['short_tokens']} tokens at a time; {o['processes']} daphne "
            f"processes; {o['seconds']:g} s per mode"
        )
        results = {}
        try:
            with stack_session(drop=name, say=self.out):
                for mode in modes:
                    results[mode] = self.one(name=name, mode=mode, o=o)
        except StackError as exc:
            raise CommandError(str(exc)) from None
        self.summary(results)

    def one(self, *, name: str, mode: str, o) -> fairness.Result:
        from inference_ops.models import ModelEndpoint

        keys: dict[str, str] = {}

        def setup() -> None:
            keys["quiet"] = bench_api_key(username="bench-quiet", name="fairness")
            keys["noisy"] = bench_api_key(username="bench-noisy", name="fairness")
            ModelEndpoint.objects.filter(name="local").update(
                capacity=o["max_num_seqs"] if mode == "on" else None
            )

        with stack_run(
            name=name,
            sim_args=engine.simulator_args(
                max_num_seqs=o["max_num_seqs"], ttft=o["ttft"], itl=o["itl"]
            ),
            engine_fields=(
                bundled_vllm_fields(max_num_seqs=o["max_num_seqs"])
                if o["engine"] == "vllm"
                else None
            ),
            gateway_extra={
                "CHAT_RATE_LIMIT": "1000000",
                "CHAT_MAX_STREAMS_PER_USER": "1000000",
                "LOG_LEVEL": "WARNING",
            },
            # The per-process cap above the noisy tenant's streams: only the engine, or the
            # admission, decides what waits.
            local_max_concurrency=o["streams"] * 4,
            web_concurrency=o["processes"],
            log_dir=o["log_dir"] / mode if o["log_dir"] else None,
            setup=setup,
        ) as stack:
            result = asyncio.run(
                fairness.run(
                    url=stack.gateway.url,
                    simulator_url=stack.simulator_url,
                    model="local",
                    quiet_key=keys["quiet"],
                    noisy_key=None if mode == "alone" else keys["noisy"],
                    streams=o["streams"],
                    long_tokens=o["long_tokens"],
                    short_tokens=o["short_tokens"],
                    seconds=o["seconds"],
                    warmup=o["warmup"],
                )
            )
        self.out(f"  {mode}: {self.line(result)}")
        return result

    @staticmethod
    def line(result: fairness.Result) -> str:
        t = result.ttfts
        text = (
            f"quiet TTFT p50 {percentile(t, 0.5) * 1000:.0f} ms, p99 "
            f"{percentile(t, 0.99) * 1000:.0f} ms, max {max(t, default=0) * 1000:.0f} ms "
            f"({len(t)} questions, {result.quiet_failed} "
            f"failed); engine {result.output_tokens_per_s:.0f} output tokens/s"
        )
        if result.noisy is not None:
            n = result.noisy
            failed = ", ".join(f"{k} {v}" for k, v in sorted(n.failed.items())) or "none"
            text += f"; noisy: {n.started} started, {n.completed} completed, failed: {failed}"
        return text

    def summary(self, results: dict[str, fairness.Result]) -> None:
        alone, off, on = (results.get(m) for m in MODES)
        self.out("")
        if alone and on:
            ratio = percentile(on.ttfts, 0.99) / percentile(alone.ttfts, 0.99)
            self.out(f"quiet p99 with admission / alone: {ratio:.2f}x (target ≤ 2)")
        if alone and off:
            ratio = percentile(off.ttfts, 0.99) / percentile(alone.ttfts, 0.99)
            self.out(f"quiet p99 without admission / alone: {ratio:.2f}x")
        if off and on:
            ratio = on.output_tokens_per_s / off.output_tokens_per_s
            self.out(f"engine throughput with / without admission: {ratio:.3f} (target ≥ 0.95)")
        if on and on.noisy is not None:
            lost = on.noisy.started - on.noisy.completed
            self.out(f"noisy requests not completed with admission: {lost} (target 0)")
