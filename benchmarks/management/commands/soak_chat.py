"""Hold the browser chat under load and check every token: N logged-in WebSockets, each asking
again as soon as its answer ends, for a while.

    python manage.py soak_chat [--sockets 200] [--seconds 60] [--ttft 100] [--itl 13] [--no-keep]

It starts its own stack (as `bench_chat` does): the vLLM simulator in echo mode, so each answer
must be its question, token for token, and the gateway under daphne with production settings
on `soak_chat_<database>`, its rate limit lifted (each socket asks hundreds of times). After the
run it compares every answer with what the engine sent (the question) and with what the gateway
stored (the chat session's assistant messages, in order), and prints the gateway process's
memory through the run. Exit status 1 when any answer failed, was lost, reordered or stored
wrong: a soak is a check, unlike the benches.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, chat_ws, engine, servers, stats
from benchmarks.stack import StackError, stack_run, stack_session
from benchmarks.users import bench_user, session_cookie


def question(socket: int, number: int) -> str:
    # Distinct, in no KB, short enough to come back whole within the answer's token limit.
    return (
        f"Soak check {number + 1} of socket {socket + 1}: "
        f"how do the tides move near lighthouse {socket + 1}?"
    )


class _Memory(threading.Thread):
    """The resident memory of one process, sampled every `every` seconds until stopped."""

    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples = pid, every, []
        self._done = threading.Event()

    def rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                line = next(line for line in status if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None
        return int(line.split()[1]) / 1024

    def run(self):
        while not self._done.wait(self.every):
            rss = self.rss_mb()
            if rss is not None:
                self.samples.append((time.monotonic(), rss))

    def stop(self):
        self._done.set()
        self.join(5)


class Command(BaseCommand):
    help = (
        "Soak the browser chat: N WebSockets asking for a while, "
        "every token checked against the engine."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--sockets", type=int, default=200, help="concurrent sockets (default 200)"
        )
        parser.add_argument(
            "--seconds", type=float, default=60.0, help="how long they ask (default 60)"
        )
        arguments.simulator_latency_add(parser, ttft=100.0, itl=13.0)
        parser.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="seconds one answer may take before it counts as failed (default 60)",
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the soak database for the next run"
        )

    def handle(self, *args, sockets, seconds, ttft, itl, timeout, keep, **options):
        if sockets < 1 or seconds <= 0 or timeout <= 0:
            raise CommandError("--sockets must be at least 1, --seconds and --timeout positive")
        name = f"soak_chat_{settings.DATABASES['default']['NAME']}"
        sim_args = [
            *engine.simulator_args(max_num_seqs=sockets, ttft=ttft, itl=itl),
            "--mode",
            "echo",
        ]
        try:
            with (
                stack_session(drop=None if keep else name, say=self.out),
                stack_run(
                    name=name,
                    sim_args=sim_args,
                    local_max_concurrency=sockets,
                    gateway_extra={"CHAT_RATE_LIMIT": "1000000000"},
                ) as stack,
            ):
                self.out(
                    f"{sockets} sockets for {seconds:g} s; "
                    f"simulator in echo mode (TTFT {ttft:g} ms, ITL {itl:g} ms); "
                    f"gateway pid {stack.gateway_pid}; {os.cpu_count()} CPUs, "
                    f"load average {os.getloadavg()[0]:.2f}"
                )
                failed = self.soak(
                    url=stack.gateway.url,
                    pid=stack.gateway_pid,
                    sockets=sockets,
                    seconds=seconds,
                    timeout=timeout,
                    log=stack.gateway.log_path,
                )
        except StackError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the servers started here were stopped", returncode=130
            ) from None
        if failed:
            raise CommandError(f"{failed} answer(s) failed, lost, reordered or stored wrong")

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def soak(self, *, url, pid, sockets, seconds, timeout, log) -> int:
        users = [bench_user(username=f"soak-chat-{i:03d}") for i in range(sockets)]
        cookies = [session_cookie(user=user) for user in users]
        warm = asyncio.run(
            chat_ws.run_level(
                base_url=url,
                cookies=cookies[:1],
                answers=1,
                question=lambda s, n: "Warm up: say anything.",
                timeout=timeout,
            )
        )
        if not warm.completed:
            raise CommandError(
                f"the warm-up answer failed: {dict(warm.errors) or 'no answer'}\n"
                f"daphne log (tail):\n{servers.log_tail(log)}"
            )
        memory = _Memory(pid)
        before = memory.rss_mb()
        memory.start()
        try:
            level = asyncio.run(
                chat_ws.run_level(
                    base_url=url,
                    cookies=cookies,
                    answers=0,
                    question=question,
                    timeout=timeout,
                    seconds=seconds,
                )
            )
        finally:
            memory.stop()
        return self.report(level, memory, before)

    def report(self, level: chat_ws.Level, memory: _Memory, before: float | None) -> int:
        done = level.completed
        wrong = [a for a in done if a.text != a.asked]
        stored = self.stored_mismatches(done)
        ttfts = [a.ttft for a in done if a.ttft is not None]
        tokens = sum(a.tokens or 0 for a in done)
        self.out(
            f"answers: {len(done)} completed in {level.makespan:.1f} s "
            f"({len(done) / level.makespan:.1f}/s, {tokens / level.makespan:.0f} tokens/s); "
            f"first token p50 {1000 * stats.percentile(ttfts, 0.5):.0f} ms, "
            f"p99 {1000 * stats.percentile(ttfts, 0.99):.0f} ms"
        )
        errors = level.errors
        self.out(f"errors: {sum(errors.values())}" + (f" ({dict(errors)})" if errors else ""))
        self.out(
            "answers that differ from what the engine sent "
            f"(lost, reordered or duplicated tokens): {len(wrong)}"
        )
        for answer in wrong[:3]:
            self.out(
                f"  socket {answer.socket} answer {answer.index}: "
                f"{answer.text!r} != {answer.asked!r}"
            )
        self.out(f"answers stored differently from what the socket showed: {stored}")
        if memory.samples:
            rss = [value for _, value in memory.samples]
            half = rss[len(rss) // 2]
            self.out(
                f"gateway memory (RSS): {before:.0f} MB after the warm-up, "
                f"{half:.0f} MB at half time, {rss[-1]:.0f} MB at the end, "
                f"{max(rss):.0f} MB at most; second half {rss[-1] - half:+.0f} MB"
            )
        return sum(errors.values()) + len(wrong) + stored

    def stored_mismatches(self, answers: list[chat_ws.Answer]) -> int:
        from chat.models import Message

        by_session: dict[int, list[chat_ws.Answer]] = {}
        for answer in sorted(answers, key=lambda a: (a.socket, a.index)):
            by_session.setdefault(answer.session, []).append(answer)
        mismatches = 0
        stored = {}
        for message in (
            Message.objects.filter(
                session_id__in=[s for s in by_session if s is not None], role=Message.Role.ASSISTANT
            )
            .order_by("session_id", "pk")
            .values("session_id", "content")
        ):
            stored.setdefault(message["session_id"], []).append(message["content"])
        for session, shown in by_session.items():
            kept = stored.get(session, [])
            mismatches += sum(
                1 for i, answer in enumerate(shown) if i >= len(kept) or kept[i] != answer.text
            )
        return mismatches
