"""Load-test an OpenAI-compatible chat API (the gateway's /v1, an engine, another gateway).

    python manage.py bench [--base-url http://127.0.0.1:8000/v1] [--api-key KEY] [--model auto]
        [--concurrency 1,16,64,256 | --request-rate 5,20 [--burstiness 1] [--max-concurrency N]]
        [--num-requests N] [--max-tokens 128] [--dataset kb|chat|long | --dataset-path FILE.jsonl]
        [--compare URL [--compare-api-key KEY] [--compare-model M] [--rounds 3]]
        [--json FILE [--save-requests]] [--plot FILE.png] [--cpu-pids PID,... | --cpu-match REGEX]

Prints a table per level (TTFT, TPOT, ITL, E2E latency as vLLM defines them; throughput;
failures by error; the road mix), a summary across levels, and with --compare the TTFT the
first URL adds over the second. Needs no database: it only speaks HTTP.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments
from benchmarks import report as bench_report
from benchmarks.cpu import DEFAULT_MATCH, probe_for
from benchmarks.loadgen import BenchError, Level, LoadOptions, Target
from benchmarks.loadgen_rounds import benchmark_run
from benchmarks.prompts import DATASETS, PromptError, prompts_builtin, prompts_load


class Command(BaseCommand):
    help = (
        "Load-test an OpenAI-compatible chat API by concurrency or request rate, "
        "like `vllm bench serve`."
    )
    # Nothing here touches the database: no checks (they may connect), no migrations needed.
    requires_system_checks = []

    def add_arguments(self, parser):
        target = parser.add_argument_group("target")
        target.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000/v1",
            help="OpenAI-compatible base URL, up to /v1 (default: the local gateway)",
        )
        target.add_argument(
            "--api-key",
            default=os.environ.get("OPENAI_API_KEY"),
            help="sent as a bearer token (default: $OPENAI_API_KEY)",
        )
        target.add_argument(
            "--model",
            default="auto",
            help="model name; auto (default) is the gateway's routing, or the first model "
            "/models lists where auto is not served",
        )
        target.add_argument(
            "--header",
            action="append",
            default=[],
            type=arguments.header,
            metavar="'NAME: VALUE'",
            help="an extra request header, repeatable (e.g. 'X-Sim-Fail: 429' for the simulator)",
        )
        load = parser.add_argument_group("load")
        load.add_argument(
            "--concurrency",
            type=arguments.levels,
            default=None,
            help="levels of requests in flight, closed loop (default 1,16,64,256)",
        )
        load.add_argument(
            "--request-rate",
            type=arguments.rates,
            default=None,
            help="levels of request rate in req/s (inf: all at once), instead of --concurrency",
        )
        load.add_argument(
            "--burstiness",
            type=float,
            default=1.0,
            help="with --request-rate: gamma shape of the gaps; 1 is Poisson (default)",
        )
        load.add_argument(
            "--max-concurrency",
            type=int,
            default=None,
            help="with --request-rate: a cap on requests in flight",
        )
        load.add_argument(
            "--num-requests",
            type=int,
            default=None,
            help="requests per level (default: max(4 x concurrency, 32); 10 s worth at a rate)",
        )
        load.add_argument(
            "--max-tokens", type=int, default=128, help="max_tokens per request (default 128)"
        )
        load.add_argument(
            "--ignore-eos",
            action="store_true",
            help="send ignore_eos (vLLM's extension) so every answer is max_tokens long",
        )
        arguments.load_limits_add(load)
        load.add_argument(
            "--warmup", type=int, default=1, help="uncounted requests per target first (default 1)"
        )
        load.add_argument(
            "--seed", type=int, default=0, help="order of prompts and arrival times (default 0)"
        )
        prompts = parser.add_argument_group("prompts")
        prompts.add_argument(
            "--dataset",
            choices=sorted(DATASETS),
            default="kb",
            help="built-in prompts: kb (factual support questions, default), chat (short "
            "messages), long (long inputs and long-form writing)",
        )
        prompts.add_argument(
            "--dataset-path",
            type=Path,
            default=None,
            help='JSONL, one {"prompt": ...} or {"messages": [...]} per line',
        )
        prompts.add_argument(
            "--repeat-prompts",
            action="store_true",
            help="send the base prompts as they are (by default each request's is made unique "
            "so caches of earlier answers do not flatter the figures)",
        )
        compare = parser.add_argument_group("comparison")
        compare.add_argument(
            "--compare",
            metavar="URL",
            default=None,
            help="a second base URL given the same load, interleaved round by round",
        )
        compare.add_argument("--compare-api-key", default=None, help="its key (default: --api-key)")
        compare.add_argument("--compare-model", default="auto", help="its model (default auto)")
        compare.add_argument(
            "--rounds",
            type=int,
            default=None,
            help="times each level runs per target (default 3 with --compare, else 1)",
        )
        cpu = parser.add_argument_group("server CPU (processes on this machine)")
        cpu.add_argument(
            "--cpu-pids",
            type=arguments.levels,
            default=None,
            help="measure these processes and their children (for --base-url; a --compare URL "
            "gets the default)",
        )
        cpu.add_argument(
            "--cpu-match",
            default=None,
            metavar="REGEX",
            help="measure processes whose command line matches (default for a loopback URL: "
            f"the process tree matching {DEFAULT_MATCH!r} that serves its port)",
        )
        output = parser.add_argument_group("output")
        arguments.json_add(output)
        output.add_argument(
            "--save-requests", action="store_true", help="with --json: every request's raw figures"
        )
        output.add_argument(
            "--plot", type=Path, default=None, help="write a PNG: TTFT and throughput per level"
        )
        arguments.progress_add(output)

    def handle(self, *args, **o):
        if o["concurrency"] and o["request_rate"]:
            raise CommandError(
                "--concurrency and --request-rate are two ways to set the load: give one "
                "(--max-concurrency caps a rate)"
            )
        for name in ("max_tokens", "warmup", "num_requests", "max_concurrency", "rounds"):
            if o[name] is not None and o[name] < (0 if name == "warmup" else 1):
                raise CommandError(f"--{name.replace('_', '-')} is too small: {o[name]}")
        if min(o["timeout"], o["max_duration"], o["burstiness"]) <= 0 or o["cooldown"] < 0:
            raise CommandError("--timeout, --max-duration and --burstiness must be above 0")
        if o["request_rate"]:
            levels = [
                Level(
                    request_rate=r, burstiness=o["burstiness"], max_concurrency=o["max_concurrency"]
                )
                for r in o["request_rate"]
            ]
        else:
            levels = [Level(concurrency=c) for c in (o["concurrency"] or [1, 16, 64, 256])]
        try:
            if o["dataset_path"]:
                prompts = prompts_load(
                    path=o["dataset_path"], repeat=o["repeat_prompts"], seed=o["seed"]
                )
            else:
                prompts = prompts_builtin(
                    name=o["dataset"], repeat=o["repeat_prompts"], seed=o["seed"]
                )
        except PromptError as exc:
            raise CommandError(str(exc)) from None
        headers = tuple(o["header"])
        targets = [
            Target(
                base_url=o["base_url"],
                api_key=o["api_key"],
                model=o["model"],
                name="A",
                headers=headers,
                cpu=probe_for(base_url=o["base_url"], pids=o["cpu_pids"], match=o["cpu_match"]),
            )
        ]
        if o["compare"]:
            targets.append(
                Target(
                    base_url=o["compare"],
                    api_key=o["compare_api_key"] or o["api_key"],
                    model=o["compare_model"],
                    name="B",
                    headers=headers,
                    cpu=probe_for(base_url=o["compare"]),
                )
            )
        rounds = o["rounds"] or (3 if o["compare"] else 1)
        options = LoadOptions(
            max_tokens=o["max_tokens"],
            num_requests=o["num_requests"],
            timeout=o["timeout"],
            max_duration=o["max_duration"],
            ignore_eos=o["ignore_eos"],
            seed=o["seed"],
            cooldown=o["cooldown"],
            warmup=o["warmup"],
            progress=not o["no_progress"],
        )
        self.stdout.write(
            f"bench: {len(levels)} levels x {rounds} rounds x {len(targets)} targets; "
            f"prompts {prompts.name}, max_tokens {options.max_tokens}, "
            f"timeout {options.timeout:g} s"
        )
        for target in targets:
            if target.cpu is None:
                self.stdout.write(f"{target.name}: no local process to measure the CPU of")
        try:
            report = asyncio.run(
                benchmark_run(
                    targets=targets,
                    levels=levels,
                    prompts=prompts,
                    options=options,
                    rounds=rounds,
                    on_run=lambda run: self.stdout.write(bench_report.level_table(run)),
                    on_note=self.stdout.write,
                )
            )
        except BenchError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write("")
        self.stdout.write(bench_report.summary_table(report))
        if report["compare"]:
            self.stdout.write("")
            self.stdout.write(bench_report.compare_table(report))
        if o["json"]:
            bench_report.json_write(report=report, path=o["json"], save_requests=o["save_requests"])
            self.stdout.write(f"wrote {o['json']}")
        if o["plot"]:
            bench_report.plot_write(report=report, path=o["plot"])
            self.stdout.write(f"wrote {o['plot']}")
