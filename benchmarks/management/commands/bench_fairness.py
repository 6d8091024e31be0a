"""Fair share at the engine's capacity: does one busy tenant make everyone queue?

    python manage.py bench_fairness [--streams 48] [--max-num-seqs 16] [--seconds 40]
        [--long-tokens 256] [--short-tokens 16] [--ttft 100] [--itl 20] [--processes 2]
        [--engine simulator|vllm] [--capacity N] [--deadline S] [--modes alone,off,on,floor]

Each run starts its own stack (a database of its own, the demo data, the simulator as the engine
with `--max-num-seqs` sequences decoded at once, the gateway with `--processes` daphne processes
and Redis keys of its own) three times, once per mode:

- alone: the quiet tenant by itself (one short question at a time through /v1, with a key of its
  own), the demo's `local` endpoint without a capacity (today's code);
- off: beside the noisy tenant (`--streams` long streams at once through /v1, refilled as they
  end), no capacity: every request goes to the engine, which queues what it cannot decode;
- on: the same, the endpoint's capacity set to `--capacity` (default `--max-num-seqs`;
  inference_ops.admission): the requests past it wait in the gateway, in fair-share order, and
  ADMISSION_RESERVE of them (1) is kept from the noisy tenant; a request still waiting at its
  class's deadline (`--deadline`, the API class's, ADMISSION_DEADLINE_API: 30 s) is refused with
  a 429 and counted among the noisy tenant's failures;
- floor (not by default): no gateway at all: the quiet tenant straight to the engine beside as many
  noisy streams straight to the engine as admission lets the noisy tenant run (`--capacity` less
  the reserve): what the engine itself costs a question that joins that batch, the best any
  admission in front of it can do at that capacity.

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
ALL_MODES = (*MODES, "floor")


class Command(BaseCommand):
    help = "Measure a quiet tenant's TTFT beside a noisy one, with and without fair admission."

    def add_arguments(self, parser):
        parser.add_argument("--streams", type=int, default=48, help="the noisy tenant's streams")
        parser.add_argument("--max-num-seqs", type=int, default=16)
        parser.add_argument(
            "--capacity", type=int, help="the endpoint's capacity with admission (--max-num-seqs)"
        )
        parser.add_argument("--seconds", type=float, default=40.0, help="per mode")
        parser.add_argument("--warmup", type=float, default=5.0)
        parser.add_argument(
            "--deadline",
            type=float,
            help="the API class's admission deadline, s (ADMISSION_DEADLINE_API: 30)",
        )
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
        if not modes or set(modes) - set(ALL_MODES):
            raise CommandError(f"--modes: a comma-separated list of {', '.join(ALL_MODES)}")
        if o["capacity"] is None:
            o["capacity"] = o["max_num_seqs"]
        if min(o["streams"], o["max_num_seqs"], o["processes"], o["capacity"]) < 1:
            raise CommandError("--streams, --max-num-seqs, --capacity and --processes must be > 0")
        if o["seconds"] <= 0:
            raise CommandError("--seconds must be > 0")
        if o["deadline"] is not None and o["deadline"] <= 0:
            raise CommandError("--deadline must be > 0")
        deadline = settings.ADMISSION_DEADLINE_API if o["deadline"] is None else o["deadline"]
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
            f"processes; capacity with admission {o['capacity']} (reserve "
            f"{settings.ADMISSION_RESERVE}, API deadline {deadline:g} s); "
            f"{o['seconds']:g} s per mode"
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
                capacity=o["capacity"] if mode == "on" else None
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
                **(
                    {"ADMISSION_DEADLINE_API": str(o["deadline"])}
                    if o["deadline"] is not None
                    else {}
                ),
            },
            # The per-process cap above the noisy tenant's streams: only the engine, or the
            # admission, decides what waits.
            local_max_concurrency=o["streams"] * 4,
            web_concurrency=o["processes"],
            log_dir=o["log_dir"] / mode if o["log_dir"] else None,
            setup=setup,
        ) as stack:
            direct = mode == "floor"
            result = asyncio.run(
                fairness.run(
                    url=stack.simulator_url if direct else stack.gateway.url,
                    simulator_url=stack.simulator_url,
                    model=stack.model if direct else "local",
                    quiet_key="engine" if direct else keys["quiet"],
                    noisy_key=(None if mode == "alone" else "engine" if direct else keys["noisy"]),
                    streams=(
                        max(o["capacity"] - settings.ADMISSION_RESERVE, 1)
                        if direct
                        else o["streams"]
                    ),
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
        alone, off, on, floor = (results.get(m) for m in ALL_MODES)
        self.out("")
        if floor and on:
            ratio = percentile(on.ttfts, 0.99) / percentile(floor.ttfts, 0.99)
            self.out(f"quiet p99 with admission / the engine's floor: {ratio:.2f}x")
        if floor and alone:
            ratio = percentile(floor.ttfts, 0.99) / percentile(alone.ttfts, 0.99)
            self.out(f"quiet p99 at the engine's floor / alone: {ratio:.2f}x")
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
