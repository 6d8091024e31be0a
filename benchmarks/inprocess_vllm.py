"""The "after" side of `manage.py bench_inprocess`: the vLLM server on the bundled model,
started on a free port and stopped with its process group, and the same answers as the in-process
side's asked of it over HTTP (a warm-up answer, one alone, two at once)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
from django.core.management.base import CommandError

from benchmarks import inprocess, servers
from core.processes import free_port, stop_group
from inference_ops import policy_env, vllm_engine

SERVED_NAME = vllm_engine.BUNDLED_MODEL
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
KV_CACHE_BYTES = 512 * 1024 * 1024
# vLLM logs the cores its OpenMP threads are bound to; the in-process side is told to match.
CORES_LINE = re.compile(r"local_rank=0, core ids=\[([\d, ]*)\]")


@dataclass(frozen=True)
class Server:
    url: str  # without /v1
    pid: int


def engine_env() -> dict[str, str]:
    # The supervisor's clean environment (no secrets of the gateway's), offline: the model is a
    # folder on disk and nothing may be downloaded in the middle of a measurement.
    return {
        **policy_env.engine_base_environment(),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def vllm_server(
    *, model_dir: Path, env: dict[str, str], log_path: Path, start_timeout: float
) -> Iterator[Server]:
    """The vLLM server on the converted model on a free port, ready when yielded, stopped with its
    process group at the end."""
    port = free_port()
    argv = [
        *vllm_engine.server_command(),
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # its own group: stop_group takes its workers too
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        for path in ("/health", "/v1/models"):
            while not _answers(f"{url}{path}"):
                if process.poll() is not None:
                    raise CommandError(
                        f"vLLM exited with {process.returncode}:\n{servers.log_tail(log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"vLLM was not ready within {start_timeout:.0f} s:\n"
                        f"{servers.log_tail(log_path)}"
                    )
                time.sleep(1)
        yield Server(url=url, pid=process.pid)
    finally:
        stop_group(process, timeout=20)


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    return False


def bound_cores(log_path: Path) -> list[int] | None:
    match = CORES_LINE.search(log_path.read_text(errors="replace"))
    return [int(core) for core in match.group(1).split(",") if core.strip()] if match else None


async def after_round(
    *, url: str, conversations: list[list[dict]], tokens: int, timeout: float
) -> dict:
    """The same measurements as the in-process side's, against the server: a warm-up answer, one
    alone, two at once."""
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", timeout=timeout, max_retries=0
    )
    try:
        await _ask(
            client=client, messages=conversations[0], tokens=min(tokens, inprocess.WARMUP_TOKENS)
        )
        one = await _at_once(client=client, conversations=conversations[1:2], tokens=tokens)
        two = await _at_once(client=client, conversations=conversations[2:4], tokens=tokens)
    except openai.OpenAIError as exc:
        raise CommandError(f"vLLM failed an answer: {exc}") from None
    finally:
        await client.close()
    return {
        "one_s": one["makespan_s"],
        "two_s": two["makespan_s"],
        "answers": one["answers"] + two["answers"],
    }


async def _at_once(
    *, client: openai.AsyncOpenAI, conversations: list[list[dict]], tokens: int
) -> dict:
    start = time.perf_counter()

    async def timed(messages: list[dict]) -> dict:
        usage = await _ask(client=client, messages=messages, tokens=tokens)
        return {
            "seconds": time.perf_counter() - start,
            "prompt_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
        }

    answers = await asyncio.gather(*(timed(messages) for messages in conversations))
    makespan = time.perf_counter() - start
    if short := [a["output_tokens"] for a in answers if a["output_tokens"] != tokens]:
        raise CommandError(f"vLLM answered {short} tokens where {tokens} were asked")
    return {"makespan_s": makespan, "answers": answers}


async def _ask(*, client: openai.AsyncOpenAI, messages: list[dict], tokens: int):
    response = await client.chat.completions.create(
        model=SERVED_NAME,
        messages=messages,
        max_tokens=tokens,
        temperature=0,
        # vLLM's extension: the answer runs to max_tokens, as min_new_tokens makes it in-process.
        extra_body={"ignore_eos": True},
    )
    return response.usage
