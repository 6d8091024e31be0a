"""What resuming a running answer costs: reconnects that join it against reconnects that do not.

    python manage.py bench_resume [--answers 8] [--reconnects 200] [--concurrency 8]
        [--rounds 3] [--web-concurrency 2] [--idle 2] [--itl 20] [--no-keep]

It starts its own stack (as `bench_chat` does): the vLLM simulator, and the gateway with
`--web-concurrency` daphne processes on one socket (`config.web`, as in production) on
`bench_resume_<database>`. Then (benchmarks.resume): `--answers` users each start one long answer
and leave it running; in each of `--rounds` rounds, an idle phase, `--reconnects` plain
reconnects and as many reconnects that join their user's running answer, the gateway's CPU read
from /proc around each. Printed per round and as medians: the CPU per reconnect of each, and
what joining adds; the join's wait for its `resume` frame; how many resumed a live answer.

With two web processes about half the joins land on the process that runs the answer, the others
go through Redis (chat.live.Relay). A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, engine, resume, stats
from benchmarks.cpu import GATEWAY_KINDS, TICKS, CpuProbe
from benchmarks.stack import StackError, stack_run, stack_session
from benchmarks.users import bench_user, session_cookie

MAX_TOKENS = 3500  # per answer: within the demo model's window, with the question


def question(user: int) -> str:
    return f"Write a long story about lighthouse keeper number {user + 1} and the winter storms."


class Command(BaseCommand):
    help = "Measure the gateway's CPU per reconnect that resumes a running answer."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--answers", type=int, default=8, help="running answers (default 8)")
        parser.add_argument(
            "--reconnects", type=int, default=200, help="reconnects per phase (default 200)"
        )
        parser.add_argument(
            "--concurrency", type=int, default=8, help="reconnecting clients at once (default 8)"
        )
        parser.add_argument("--rounds", type=int, default=3, help="rounds of phases (default 3)")
        parser.add_argument(
            "--web-concurrency", type=int, default=2, help="daphne processes (default 2)"
        )
        parser.add_argument(
            "--idle", type=float, default=2.0, help="seconds of the idle phase (default 2)"
        )
        parser.add_argument(
            "--itl", type=float, default=20.0, help="the simulator's inter-token latency, ms"
        )
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds per frame")
        arguments.keep_add(parser)

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        if min(o["answers"], o["reconnects"], o["concurrency"], o["rounds"]) < 1:
            raise CommandError("--answers, --reconnects, --concurrency and --rounds must be >= 1")
        if o["web_concurrency"] < 1 or o["idle"] <= 0 or o["itl"] <= 0 or o["timeout"] <= 0:
            raise CommandError("--web-concurrency must be >= 1, --idle, --itl, --timeout positive")
        name = f"bench_resume_{settings.DATABASES['default']['NAME']}"
        # Long enough answers that every phase finds them running: the rounds' reconnects at a
        # few ms each, the idle phases, and a margin of a minute.
        # The demo model's window is 4,096 tokens: a slower pace rather than more tokens.
        seconds = o["rounds"] * (3 * o["idle"] + 2 * o["reconnects"] * 0.05) + 60
        o["itl"] = max(o["itl"], seconds * 1000 / MAX_TOKENS)
        max_tokens = min(MAX_TOKENS, int(seconds * 1000 / o["itl"]) + 1)
        try:
            with (
                stack_session(drop=None if o["keep"] else name, say=self.out),
                stack_run(
                    name=name,
                    sim_args=engine.simulator_args(max_num_seqs=64, ttft=50, itl=o["itl"]),
                    web_concurrency=o["web_concurrency"],
                    gateway_extra={
                        "ROUTING_DEFAULT_MAX_TOKENS": str(max_tokens),
                        "CHAT_RATE_LIMIT": "1000000000",
                        # Every reconnect of the join phase joins: a user's run past the limit.
                        "CHAT_JOIN_RATE_LIMIT": "1000000000",
                    },
                ) as stack,
            ):
                self.out(
                    f"{o['answers']} answers of {max_tokens} tokens (ITL {o['itl']:g} ms) "
                    f"running; {o['web_concurrency']} web process(es) under pid "
                    f"{stack.gateway_pid}; {os.cpu_count()} CPUs, load average "
                    f"{os.getloadavg()[0]:.2f}"
                )
                self.run(url=stack.gateway.url, pid=stack.gateway_pid, **o)
        except StackError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None

    def run(self, *, url, pid, answers, reconnects, concurrency, rounds, idle, timeout, **o):
        users = [bench_user(username=f"bench-resume-{i:03d}") for i in range(answers)]
        cookies = [session_cookie(user=user) for user in users]
        probe = CpuProbe(roots=(pid,))

        def cpu() -> float:
            ticks = sum(t for kind, _, t in probe.snapshot().values() if kind in GATEWAY_KINDS)
            return ticks * 1000 / TICKS

        try:
            message_ids = asyncio.run(
                resume.answers_start(url=url, cookies=cookies, question=question, timeout=timeout)
            )
        except (RuntimeError, TimeoutError, ConnectionError, OSError) as exc:
            raise CommandError(f"could not start the answers: {exc}") from None
        phases: list[resume.Phase] = []
        header = (
            f"{'round':>5} {'phase':>9} {'count':>6} {'s':>6} {'CPU ms':>8} {'ms/reconn':>10} "
            f"{'wait p50':>9} {'wait p99':>9} {'live':>6}"
        )
        self.out("\nCPU: the gateway's web processes; 'ms/reconn' after the idle rate is taken off")
        self.out(header)
        self.out("-" * len(header))
        for number in range(1, rounds + 1):
            for kind in resume.PHASES:
                phase = asyncio.run(
                    resume.phase_run(
                        kind=kind,
                        url=url,
                        cookies=cookies,
                        message_ids=message_ids,
                        count=reconnects,
                        concurrency=concurrency,
                        seconds=idle,
                        cpu=cpu,
                        timeout=timeout,
                    )
                )
                phases.append(phase)
                self.report(number, phase, resume.resume_cost(phases)["idle_ms_per_s"])
        cost = resume.resume_cost(phases)
        median = lambda values: stats.percentile(values, 0.5)  # noqa: E731
        span = lambda values: f"{min(values):.2f}–{max(values):.2f}"  # noqa: E731
        joins = [p for p in phases if p.kind == "join"]
        self.out(
            f"\nidle: {cost['idle_ms_per_s']:.1f} ms of CPU per second "
            f"({answers} answers running, no socket)"
        )
        self.out(
            f"reconnect alone: {median(cost['reconnect']):.2f} ms of CPU "
            f"({span(cost['reconnect'])})"
        )
        self.out(f"reconnect + join: {median(cost['join']):.2f} ms ({span(cost['join'])})")
        self.out(
            f"resuming adds: {median(cost['added']):.2f} ms of CPU per reconnect "
            f"({span(cost['added'])}), median of {rounds} round(s)"
        )
        resumed = sum(p.live for p in joins)
        self.out(
            f"joins that resumed a live answer: {resumed} of {sum(p.count for p in joins)} "
            f"({sum(p.texts for p in joins)} with text so far)"
        )
        errors = sum((p.errors for p in phases), start=Counter())
        self.out(f"errors: {sum(errors.values())}" + (f" ({dict(errors)})" if errors else ""))

    def report(self, number: int, phase: resume.Phase, rate: float) -> None:
        per = (
            f"{(phase.cpu_ms - rate * phase.seconds) / phase.count:>10.2f}"
            if phase.count
            else f"{'-':>10}"
        )
        waits = (
            f"{1000 * stats.percentile(phase.waits, 0.5):>9.1f} "
            f"{1000 * stats.percentile(phase.waits, 0.99):>9.1f}"
            if phase.waits
            else f"{'-':>9} {'-':>9}"
        )
        live = f"{phase.live:>6}" if phase.kind == "join" else f"{'-':>6}"
        self.out(
            f"{number:>5} {phase.kind:>9} {phase.count:>6} {phase.seconds:>6.2f} "
            f"{phase.cpu_ms:>8.0f} {per} {waits} {live}"
        )
