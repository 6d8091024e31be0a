"""What a tool-call stream costs the gateway against a text stream of the same length.

    python manage.py bench_tools [--concurrency 16,64] [--requests N] [--rounds 4]
        [--ttft 100] [--itl 13] [--web-concurrency N] [--idle 5] [--json FILE] [--quick]
        [--no-keep]

It starts its own stack (benchmarks.stack): the vLLM simulator with vLLM-like latencies and its
tool parser (hermes, as make run's engine), and one daphne process with production settings
(or `--web-concurrency` processes under config.web) on `bench_tools_<database>`, with an API key.
First a few tool calls one at a time give the call's length in completion tokens (from the usage
the engine reports); the engine's own TTFT of each kind, reached directly, and the idle gateway's
CPU per second are read and printed. Then, in each of `--rounds` rounds and at each
`--concurrency` level, two phases of `--requests` streams (default max(4 x concurrency, 64)) in
ABBA order: text answers of that many tokens (`ignore_eos`), and the tool call (`tool_choice`
naming it), all through /v1 with `model: "local"`, the gateway's CPU read from /proc around each
phase (benchmarks.tools).

Printed per round and as medians with their ranges: the gateway's CPU per request of each
phase and their ratio (the issue's target: a tool-call stream at most 1.1x a text stream, met or
MISSED), TTFT p50, output tokens per second, the makespan, and failed requests (there must be
none). A figure, not a test: the command fails only when it cannot run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, engine, servers, tools
from benchmarks.cpu import GATEWAY_KINDS, TICKS, CpuProbe
from benchmarks.stack import Stack, StackError, stack_run, stack_session
from benchmarks.stats import percentile

# Far above anything a run sends: the per-user limits are the product's defence against one
# client, and the bench is one client sending thousands of streams.
RATE_LIMIT = "1000000000"
CALIBRATION_CALLS = 3


def _span(figure: dict, unit: str = "", digits: int = 2) -> str:
    return (
        f"{figure['median']:.{digits}f}{unit} "
        f"({figure['min']:.{digits}f}–{figure['max']:.{digits}f})"
    )


class Command(BaseCommand):
    help = (
        "Measure the gateway's CPU per request for a tool-call stream against a text stream of "
        "the same length, under concurrency."
    )
    # Checks may connect to the database; nothing may connect before we point at the bench database.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency",
            type=arguments.levels,
            default=[16, 64],
            help="streams at once, one level after another (default 16,64)",
        )
        parser.add_argument(
            "--requests",
            type=arguments.positive(int),
            default=None,
            help="streams per phase (default max(4 x concurrency, 64))",
        )
        parser.add_argument(
            "--rounds",
            type=arguments.positive(int),
            default=4,
            help="rounds, each a text and a tool phase per level, in ABBA order (default 4)",
        )
        arguments.simulator_latency_add(
            parser, ttft=100.0, itl=13.0, kind=arguments.positive(float)
        )
        parser.add_argument(
            "--web-concurrency",
            type=arguments.positive(int),
            default=None,
            help="the gateway through config.web with N daphne processes (default: one daphne)",
        )
        parser.add_argument(
            "--timeout",
            type=arguments.positive(float),
            default=120.0,
            help="per stream, s (default 120)",
        )
        parser.add_argument(
            "--idle",
            type=arguments.positive(float),
            default=5.0,
            help="seconds over which the idle gateway's CPU is read, before the rounds (default 5)",
        )
        parser.add_argument(
            "--cooldown", type=float, default=1.0, help="pause between phases, s (default 1)"
        )
        parser.add_argument(
            "--quick",
            action="store_true",
            help="a short run, for a test: concurrency 4, 8 requests per phase, 2 rounds, "
            "TTFT 20 ms, ITL 2 ms, 0.5 s idle (overrides the options above)",
        )
        arguments.keep_add(parser)
        arguments.log_dir_add(parser)
        arguments.json_add(parser, what="the figures")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        if o["cooldown"] < 0:
            raise CommandError("--cooldown cannot be negative")
        if o["quick"]:
            o.update(
                concurrency=[4], requests=8, rounds=2, ttft=20.0, itl=2.0, cooldown=0.2, idle=0.5
            )
        name = f"bench_tools_{settings.DATABASES['default']['NAME']}"
        load = os.getloadavg()
        self.out(
            f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at "
            "the start (the machine is shared: other work shows up in every figure)"
        )
        sim_args = engine.simulator_args(
            max_num_seqs=max(512, max(o["concurrency"])), ttft=o["ttft"], itl=o["itl"]
        )
        try:
            with (
                stack_session(drop=None if o["keep"] else name, say=self.out),
                stack_run(
                    name=name,
                    sim_args=sim_args,
                    gateway_extra={
                        "CHAT_RATE_LIMIT": RATE_LIMIT,
                        "CHAT_MAX_STREAMS_PER_USER": RATE_LIMIT,
                    },
                    local_max_concurrency=max(max(o["concurrency"]), 2),
                    web_concurrency=o["web_concurrency"],
                    log_dir=o["log_dir"],
                ) as stack,
            ):
                processes = (
                    f"config.web with {o['web_concurrency']} daphne process(es)"
                    if o["web_concurrency"]
                    else "one daphne process"
                )
                self.out(
                    f"database {name} ({'created' if stack.created else 'existing'}); simulator "
                    f"{stack.simulator_url} (TTFT {o['ttft']:g} ms, ITL {o['itl']:g} ms, tool "
                    f"parser hermes); gateway {stack.gateway.url}, {processes}, pid "
                    f"{stack.gateway_pid}"
                )
                report = self.measure(stack=stack, **o)
        except StackError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None
        if o["json"]:
            o["json"].write_text(json.dumps(report, indent=2), encoding="utf-8")
            self.out(f"wrote {o['json']}")

    def measure(self, *, stack: Stack, **o) -> dict:
        from benchmarks.users import bench_api_key

        key = bench_api_key(username="bench-tools", name="bench_tools")
        url = stack.gateway.url
        probe = CpuProbe(roots=(stack.gateway_pid,))

        def cpu() -> float:
            ticks = sum(t for kind, _, t in probe.snapshot().values() if kind in GATEWAY_KINDS)
            return ticks * 1000 / TICKS

        tokens = self.calibrate(url=url, key=key, timeout=o["timeout"], stack=stack)
        direct = asyncio.run(
            tools.engine_ttfts(
                url=stack.simulator_url,
                model=stack.model,
                tokens=tokens,
                count=CALIBRATION_CALLS,
                timeout=o["timeout"],
            )
        )
        engine_ttft = {kind: 1000 * percentile(values, 0.5) for kind, values in direct.items()}
        self.out(
            f"the engine directly, one stream at a time: TTFT p50 text {engine_ttft['text']:.1f} "
            f"ms, tool call {engine_ttft['tool']:.1f} ms (its first chunk comes once the "
            "function's name is whole)"
        )
        # The gateway's own ticks with no request (its periodic work) count in every phase alike;
        # given here so that the reader can tell how much of a phase's CPU they are.
        before = cpu()
        time.sleep(o["idle"])
        idle = (cpu() - before) / o["idle"]
        self.out(
            f"the gateway idle: {idle:.1f} ms of CPU per second over {o['idle']:g} s (not taken "
            "off the phases below)"
        )
        self.out(
            f"text answers of {tokens} tokens (max_tokens {tokens}, ignore_eos); the tool call "
            f'with tool_choice naming it; every stream model "local", usage included'
        )
        phases: list[tools.Phase] = []
        header = (
            f"{'round':>5} {'conc':>5} {'phase':>5} {'reqs':>5} {'failed':>6} {'s':>6} "
            f"{'CPU ms':>7} {'ms/req':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'tok/s':>7} "
            f"{'chunks':>6}"
        )
        self.out(
            "\nCPU: the gateway's web processes (user + system, /proc) over each phase; "
            "'chunks': chunks with content per stream"
        )
        self.out(header)
        self.out("-" * len(header))
        index = 0
        for number in range(1, o["rounds"] + 1):
            for concurrency in o["concurrency"]:
                requests = o["requests"] or max(4 * concurrency, 64)
                for kind in tools.order(number):
                    phase = asyncio.run(
                        tools.phase_run(
                            kind=kind,
                            url=url,
                            key=key,
                            concurrency=concurrency,
                            requests=requests,
                            tokens=tokens,
                            cpu=cpu,
                            timeout=o["timeout"],
                            round_number=number,
                            first_index=index,
                        )
                    )
                    index += requests
                    phases.append(phase)
                    self.report(phase)
                    if phase.failed:
                        self.out(
                            f"      failed: {dict(phase.errors)}; gateway log (tail):\n"
                            f"{servers.log_tail(stack.gateway.log_path, lines=10)}"
                        )
                    time.sleep(o["cooldown"])  # the phase's tail does not load the next
        report = self.summary(phases=phases, tokens=tokens, stack=stack, **o)
        report["engine_ttft_p50_ms"] = engine_ttft
        report["idle_cpu_ms_per_s"] = idle
        return report

    def calibrate(self, *, url: str, key: str, timeout: float, stack: Stack) -> int:
        """The tool call's length in completion tokens, from a few calls one at a time."""
        outcomes = asyncio.run(
            tools.tool_call_length(url=url, key=key, calls=CALIBRATION_CALLS, timeout=timeout)
        )
        bad = [why for out in outcomes if (why := tools.delivered(out, kind="tool", tokens=0))]
        if bad:
            raise CommandError(
                f"the tool call failed: {bad}\ngateway log (tail):\n"
                f"{servers.log_tail(stack.gateway.log_path)}"
            )
        lengths = sorted(out.tokens or 0 for out in outcomes)
        tokens = lengths[len(lengths) // 2]
        chunks = [out.chunks for out in outcomes]
        self.out(
            f"tool `{tools.TOOL_NAME}` ({len(tools.PARAMETERS['properties'])} properties): a call "
            f"of {tokens} completion tokens ({len(lengths)} calls: {lengths[0]}–{lengths[-1]}), "
            f"{min(chunks)}–{max(chunks)} chunks, finish reason {outcomes[0].finish_reason}"
        )
        if not tokens:
            raise CommandError("the engine reported no completion tokens for the tool call")
        return tokens

    def report(self, phase: tools.Phase) -> None:
        ttft = (
            f"{1000 * percentile(phase.ttfts, 0.5):>9.1f} "
            f"{1000 * percentile(phase.ttfts, 0.99):>9.1f}"
            if phase.ttfts
            else f"{'-':>9} {'-':>9}"
        )
        chunks = sum(phase.chunks) / len(phase.chunks) if phase.chunks else float("nan")
        self.out(
            f"{phase.round:>5} {phase.concurrency:>5} {phase.kind:>5} {phase.requests:>5} "
            f"{phase.failed:>6} {phase.seconds:>6.2f} {phase.cpu_ms:>7.0f} "
            f"{phase.cpu_per_request:>7.2f} {ttft} {phase.tokens_per_s:>7.0f} {chunks:>6.1f}"
        )

    def summary(self, *, phases: list[tools.Phase], tokens: int, stack: Stack, **o) -> dict:
        levels = {}
        self.out(f"\nMedians over {o['rounds']} round(s) (ranges)")
        for concurrency in o["concurrency"]:
            level = tools.level_summary([p for p in phases if p.concurrency == concurrency])
            levels[concurrency] = level
            self.out(
                f"c={concurrency}: gateway CPU per request text "
                f"{_span(level['text_cpu_ms'], ' ms')}, tool {_span(level['tool_cpu_ms'], ' ms')}; "
                "tool/text "
                f"{_span(level['ratio'], '×')}"
            )
            ttft, rate, makespan = (
                level["ttft_p50_ms"],
                level["output_tokens_per_s"],
                level["makespan_s"],
            )
            self.out(
                f"      TTFT p50 text {_span(ttft['text'], ' ms', 1)}, tool "
                f"{_span(ttft['tool'], ' ms', 1)}; output text {_span(rate['text'], ' tok/s', 0)}"
                f", tool {_span(rate['tool'], ' tok/s', 0)}; makespan text "
                f"{_span(makespan['text'], ' s')}, tool {_span(makespan['tool'], ' s')}"
            )
        self.out(f"\nTargets (gateway CPU per tool-call stream ≤ {tools.TARGET:g}× a text stream)")
        targets = []
        for concurrency, level in levels.items():
            met = tools.target_met(level)
            targets.append(
                {
                    "target": f"tool/text gateway CPU, c={concurrency}",
                    "limit": tools.TARGET,
                    "value": level["ratio"]["median"],
                    "met": met,
                }
            )
            self.out(
                f"  c={concurrency}: {level['ratio']['median']:.2f}× "
                f"({level['ratio']['min']:.2f}–{level['ratio']['max']:.2f}): "
                f"{'met' if met else 'MISSED'}"
            )
        failed = sum(p.failed for p in phases)
        errors = sum((p.errors for p in phases), start=Counter())
        targets.append(
            {"target": "failed requests", "limit": 0, "value": failed, "met": not failed}
        )
        self.out(
            f"  failed requests: {failed} of {sum(p.requests for p in phases)}"
            + (f" ({dict(errors)})" if errors else "")
            + f": {'met' if not failed else 'MISSED'}"
        )
        load = os.getloadavg()
        self.out(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
        return {
            "stack": {
                "database": stack.database,
                "ttft_ms": o["ttft"],
                "itl_ms": o["itl"],
                "web_concurrency": o["web_concurrency"],
                "cpus": os.cpu_count(),
            },
            "tool": {"name": tools.TOOL_NAME, "parameters": tools.PARAMETERS},
            "completion_tokens": tokens,
            "rounds": o["rounds"],
            "levels": {str(c): level for c, level in levels.items()},
            "phases": [p.as_dict() for p in phases],
            "targets": targets,
            "load_average_end": list(load),
        }
