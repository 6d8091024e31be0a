"""Benchmark the browser chat under load: N logged-in WebSockets, each asking in turn.

    python manage.py bench_chat [--sockets 16,64] [--questions 2] [--max-tokens 512]
                                [--ttft 50] [--itl 20] [--timeout 120] [--no-keep]
    python manage.py bench_chat --url http://127.0.0.1:8000 [--engine-url URL --engine-model NAME]

By default it starts its own stack: the vLLM simulator, and the gateway under daphne with
production settings on `bench_chat_<database>` (migrated, the demo KB and routing with the
`local` endpoint on the simulator), so nothing of the developer's data changes. With --url
it loads a gateway already running instead; this process must then share its database and
SECRET_KEY (`make run` from this checkout, with DEBUG=1 here too), because the session
cookies are made here, and --max-tokens cannot change what that gateway sends.

Each socket is its own user (bench-chat-NNN), as N browsers are; the per-user rate limit
then applies as it would. Per level: first-token p50/p99 (from sending the message frame
to the first `token` frame), the answer's end, the makespan of all answers, tokens and
frames received, the roads taken, errors; and, against the engine itself, the same number
of concurrent streams each asking as many times, and the ratio of the two makespans.
A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from benchmarks import arguments, chat_ws, engine, servers, stats
from benchmarks.cpu import CpuProbe, cpu_delta
from benchmarks.stack import StackError, stack_run, stack_session
from benchmarks.users import bench_user, session_cookie


def question(socket: int, number: int) -> str:
    # A different text for every answer, none in the KB: each one is generated, and the
    # gateway's query-vector cache is of no help, as with real users.
    return (
        f"Write a short story about lighthouse keeper number {socket + 1} and "
        f"the {number + 1}. storm of the winter."
    )


class Command(BaseCommand):
    help = (
        "Benchmark the browser chat: N logged-in WebSockets asking in turn, "
        "against the engine alone."
    )
    # Checks may connect to the database; nothing may connect before we point at the bench database.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--sockets",
            type=arguments.levels,
            default=[16, 64],
            help="concurrent sockets per level, comma-separated (default 16,64)",
        )
        parser.add_argument(
            "--questions",
            type=int,
            default=2,
            help="questions each socket asks, one after another (default 2)",
        )
        parser.add_argument(
            "--max-tokens",
            type=int,
            default=settings.ROUTING_DEFAULT_MAX_TOKENS,
            help="tokens per answer: the gateway's ROUTING_DEFAULT_MAX_TOKENS, the chat's "
            f"(default {settings.ROUTING_DEFAULT_MAX_TOKENS}); own stack only",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            help="seconds one answer may take before it counts as failed (default 120)",
        )
        parser.add_argument("--url", help="a running gateway to load instead of starting one")
        parser.add_argument(
            "--engine-url",
            help="the engine behind it, for the same load straight to the "
            "engine (default: the simulator started here)",
        )
        parser.add_argument(
            "--engine-model", help="the model name the engine serves (vLLM requires it)"
        )
        arguments.simulator_latency_add(parser, ttft=50.0, itl=20.0)
        arguments.keep_add(parser)

    def handle(
        self,
        *args,
        sockets,
        questions,
        max_tokens,
        timeout,
        url,
        engine_url,
        engine_model,
        ttft,
        itl,
        keep,
        **options,
    ):
        if questions < 1 or max_tokens < 1 or timeout <= 0:
            raise CommandError(
                "--questions and --max-tokens must be at least 1, --timeout positive"
            )
        if engine_model and not engine_url:
            raise CommandError("--engine-model names the model of --engine-url")
        own = not url
        name = f"bench_chat_{settings.DATABASES['default']['NAME']}" if own else None
        try:
            with stack_session(drop=name if own and not keep else None, say=self.out):
                if url:
                    self.out(f"gateway {url} (not started here); max tokens: the gateway's setting")
                    self.run(
                        url=url,
                        engine_url=engine_url.rstrip("/").removesuffix("/v1")
                        if engine_url
                        else None,
                        engine_model=engine_model,
                        sockets=sockets,
                        questions=questions,
                        max_tokens=max_tokens,
                        timeout=timeout,
                    )
                else:
                    self.own_stack(
                        name=name,
                        sockets=sockets,
                        questions=questions,
                        max_tokens=max_tokens,
                        timeout=timeout,
                        ttft=ttft,
                        itl=itl,
                        engine_url=engine_url,
                        engine_model=engine_model,
                    )
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    # --- the stack ------------------------------------------------------------------------------

    def own_stack(
        self, *, name, sockets, questions, max_tokens, timeout, ttft, itl, engine_url, engine_model
    ):
        sim_args = engine.simulator_args(max_num_seqs=max(sockets), ttft=ttft, itl=itl)
        try:
            with stack_run(
                name=name,
                sim_args=sim_args,
                gateway_extra={"ROUTING_DEFAULT_MAX_TOKENS": str(max_tokens)},
            ) as stack:
                self.out(
                    f"database {name} ({'created' if stack.created else 'existing'}); "
                    f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
                    "(other work on this machine shows up in every figure)"
                )
                if stack.demo_kb:
                    self.out(f"demo knowledge base: {stack.demo_kb}")
                self.out(
                    f"simulator {stack.simulator_url} (TTFT {ttft:g} ms, ITL {itl:g} ms, "
                    f"max-num-seqs {max(sockets)}); "
                    f"gateway {stack.gateway.url} (pid {stack.gateway_pid}), "
                    f"{max_tokens} tokens per answer"
                )
                try:
                    self.run(
                        url=stack.gateway.url,
                        engine_url=engine_url or stack.simulator_url,
                        engine_model=engine_model or (None if engine_url else stack.model),
                        sockets=sockets,
                        questions=questions,
                        max_tokens=max_tokens,
                        timeout=timeout,
                        pid=stack.gateway_pid,
                    )
                except RuntimeError as exc:
                    raise CommandError(
                        f"{exc}\ndaphne log (tail):\n{servers.log_tail(stack.gateway.log_path)}"
                    ) from None
        except StackError as exc:
            raise CommandError(str(exc)) from None

    # --- the run --------------------------------------------------------------------------------

    def run(
        self, *, url, engine_url, engine_model, sockets, questions, max_tokens, timeout, pid=None
    ) -> None:
        """`pid`: the gateway's process (own stack), whose CPU per answer is reported."""
        try:
            users = [bench_user(username=f"bench-chat-{i:03d}") for i in range(max(sockets) + 1)]
        except DatabaseError as exc:
            raise CommandError(
                f"cannot make the bench users in {settings.DATABASES['default']['NAME']}: {exc} "
                "(with --url, this process needs the gateway's database)"
            ) from None
        warmup, users = users[0], users[1:]
        cookies = [session_cookie(user=user) for user in users]

        # The first answer loads the embedding model in the gateway and opens its pools: not timed.
        level = asyncio.run(
            chat_ws.run_level(
                base_url=url,
                cookies=[session_cookie(user=warmup)],
                answers=1,
                question=lambda s, n: "Warm up: say anything.",
                timeout=timeout,
            )
        )
        if not level.completed:
            raise CommandError(f"the warm-up answer failed: {dict(level.errors) or 'no answer'}")

        header = (
            f"{'sockets':>7} {'answers':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'end p50':>8} {'end p99':>8} {'makespan':>9} "
            f"{'tok/ans':>8} {'frames/ans':>10} {'engine':>8} {'ratio':>6}"
        )
        self.out(
            f"\n{questions} question(s) per socket; times in ms, makespans in s; "
            "'engine': the same streams straight to the engine"
        )
        self.out(header)
        self.out("-" * len(header))
        probe = CpuProbe(roots=(pid,)) if pid else None
        for count in sockets:
            before = probe.snapshot() if probe else None
            level = asyncio.run(
                chat_ws.run_level(
                    base_url=url,
                    cookies=cookies[:count],
                    answers=questions,
                    question=question,
                    timeout=timeout,
                )
            )
            used = (
                cpu_delta(before=before, after=probe.snapshot(), requests=len(level.completed))
                if probe and before is not None
                else None
            )
            baseline = self.engine_makespan(
                engine_url, engine_model, count, questions, max_tokens, timeout
            )
            self.report(level, count * questions, baseline)
            if used and used["gateway_cpu_ms_per_request"] is not None:
                self.out(
                    f"{'':>7}   gateway CPU {used['gateway_cpu_ms_per_request']:.1f} ms per "
                    f"answer ({used['requests']} answers)"
                )

    def engine_makespan(
        self, engine_url, model, streams, answers, max_tokens, timeout
    ) -> float | None:
        if not engine_url:
            return None
        try:
            makespan, _ = asyncio.run(
                engine.run_level(
                    url=engine_url,
                    concurrency=streams,
                    answers=answers,
                    max_tokens=max_tokens,
                    timeout=timeout,
                    model=model,
                )
            )
        except (TimeoutError, OSError, RuntimeError) as exc:
            self.out(f"  the engine run failed: {type(exc).__name__}: {exc}")
            return None
        return makespan

    def report(self, level: chat_ws.Level, asked: int, baseline: float | None) -> None:
        done = level.completed
        ms = lambda values, p: 1000 * stats.percentile(values, p)  # noqa: E731
        ttfts = [a.ttft for a in done if a.ttft is not None]
        ends = [a.end for a in done]
        tokens = [a.tokens for a in done if a.tokens is not None]
        per_answer = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
        engine_text = (
            f"{baseline:>8.2f} {level.makespan / baseline:>5.2f}x"
            if baseline
            else f"{'-':>8} {'-':>6}"
        )
        self.out(
            f"{level.sockets:>7} {len(done):>4}/{asked:<3} "
            f"{ms(ttfts, 0.5):>9.1f} {ms(ttfts, 0.99):>9.1f} "
            f"{ms(ends, 0.5):>8.0f} {ms(ends, 0.99):>8.0f} {level.makespan:>9.2f} "
            f"{per_answer(tokens):>8.1f} "
            f"{per_answer([a.frames for a in done]):>10.1f} {engine_text}"
        )
        roads = Counter(a.road for a in done)
        if set(roads) - {"local"}:
            self.out(f"{'':>7}   roads: {dict(roads)}")
        for error, count in level.errors.most_common():
            self.out(f"{'':>7}   ! {count} failed: {error}")
        skipped = asked - len(level.answers)
        if skipped:
            self.out(
                f"{'':>7}   ! {skipped} questions not asked: "
                "their socket failed to open or timed out before"
            )
