"""The failover scorecard: every provider fault the gateway must survive, through the real
gateway, auto and named, scored from the caller's side (benchmarks/failover_caller.py says how).

    python manage.py bench_failover [--scenarios a,b] [--quick] [--json FILE] [--no-keep]
        [--log-dir DIR]

It starts two simulators (the primary, with a fault per scenario and mode by model name, and the
fallback), a recording relay in front of each, and the gateway with production settings on
`bench_failover_<database>` (benchmarks.stack, its own Redis key prefix), with a primary and a
fallback endpoint and a rule per scenario and mode. It prints one line per scenario and mode (the
verdict, the attempts on the primary and the fallback, the waits between attempts, the time to
the end) and the totals. A scorecard, not a test: it fails only when it cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import (
    arguments,
    failover,
    failover_recorder,
    failover_report,
    failover_run,
    servers,
)
from benchmarks.stack import StackError, stack_run, stack_session

# The per-user limits are the product's defence against one client; the bench is one client.
RATE_LIMIT = "1000000000"


class Command(BaseCommand):
    help = "Score what a caller gets from the gateway when its provider misbehaves."
    requires_system_checks = []  # nothing may connect before we point at the bench database

    def add_arguments(self, parser):
        parser.add_argument(
            "--scenarios",
            default="",
            help="comma-separated scenario names (default: all): " + ", ".join(failover.BY_NAME),
        )
        parser.add_argument(
            "--quick",
            action="store_true",
            help="a short run for a test: "
            + ", ".join(failover.QUICK)
            + " unless --scenarios, a 20 s deadline, a 10 s flap",
        )
        arguments.json_add(parser, what="the report")
        arguments.keep_add(parser)
        arguments.log_dir_add(parser, logs="the simulators' and the gateway's logs")

    def handle(self, *args, **o):
        plan = failover.Plan()
        names = [name.strip() for name in o["scenarios"].split(",") if name.strip()]
        if names:
            try:
                plan = failover.Plan(scenarios=failover.scenarios_pick(names))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if o["quick"]:
            plan = failover.plan_quick(plan)
        name = f"bench_failover_{settings.DATABASES['default']['NAME']}"
        try:
            with stack_session(drop=None if o["keep"] else name, say=self.out):
                report = self.own_stack(name=name, plan=plan, log_dir=o["log_dir"])
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None
        self.out("")
        self.out(failover_report.table_text(report))
        if o["json"]:
            o["json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            self.out(f"wrote {o['json']}")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def own_stack(self, *, name: str, plan: failover.Plan, log_dir: Path | None) -> dict:
        load = os.getloadavg()
        self.out(
            f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
            "at the start"
        )
        with contextlib.ExitStack() as stack:
            if log_dir is None:
                logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{name}_")))
            else:
                logs = log_dir
                logs.mkdir(parents=True, exist_ok=True)
            try:
                primary = stack.enter_context(
                    servers.simulator(
                        model="failover/primary",
                        args=failover.simulator_args(plan, failover.PRIMARY),
                        log_path=logs / "primary.log",
                    )
                )
                fallback = stack.enter_context(
                    servers.simulator(
                        model=failover.FALLBACK_MODEL,
                        args=failover.simulator_args(plan, failover.FALLBACK),
                        log_path=logs / "fallback.log",
                    )
                )
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
            relays = stack.enter_context(
                failover_recorder.recorders(
                    {failover.PRIMARY: primary, failover.FALLBACK: fallback}
                )
            )
            try:
                gateway = stack.enter_context(
                    stack_run(
                        name=name,
                        sim_args=["--time-to-first-token", "20", "--inter-token-latency", "10"],
                        gateway_extra={
                            "CHAT_RATE_LIMIT": RATE_LIMIT,
                            "CHAT_MAX_STREAMS_PER_USER": RATE_LIMIT,
                        },
                        log_dir=logs,
                        setup=lambda: failover.rows_create(
                            plan=plan,
                            primary_url=relays[failover.PRIMARY].url,
                            fallback_url=relays[failover.FALLBACK].url,
                        ),
                    )
                )
            except StackError as exc:
                raise CommandError(str(exc)) from None
            self.out(
                f"database {name}; primary simulator {primary}, fallback {fallback} (each "
                f"behind a recording relay); gateway {gateway.gateway.url}, "
                f"REDIS_KEY_PREFIX {gateway.redis_prefix}"
            )
            self.out(
                f"{len(plan.scenarios)} scenario(s), auto and named; {plan.max_tokens}-token "
                f"seeded answers; deadline {plan.deadline:g} s per question; endpoints' first-"
                f"token timeout {plan.first_token_timeout:g} s, idle {plan.idle_timeout:g} s"
            )
            self.out(failover_report.HEADER)
            bench = failover_run.Bench(
                gateway_url=gateway.gateway.url,
                api_key=self.api_key(),
                fallback_url=fallback,
                recorders=relays,
                say=self.out,
            )
            try:
                report = asyncio.run(bench.run(plan))
            except RuntimeError as exc:
                raise CommandError(
                    f"{exc}\ngateway log (tail):\n{servers.log_tail(gateway.gateway.log_path)}"
                ) from None
        report["stack"] = {
            "database": name,
            "primary": primary,
            "fallback": fallback,
            "load_average_start": list(load),
        }
        return report

    def api_key(self) -> str:
        from benchmarks.users import bench_api_key

        return bench_api_key(username="bench-failover", name="bench_failover")
