"""The gateway's claims, measured on a stack of its own (`manage.py bench_gateway`).

Four parts, in this order, all through the gateway's OpenAI-compatible /v1 with an API key:

1. the first question after the gateway's start, before any other request: a KB question
   asked exactly;
2. KB hits against a generated long answer, one request at a time: exact questions of the demo
   KB, paraphrases that the vector road answers, and answers of `long_tokens` tokens;
3. two concurrent long answers against one (continuous batching keeps the two close to one);
4. the concurrency sweep: the engine reached directly against the gateway with the endpoint
   named (`model: "local"`), and the engine against the gateway with `model: "auto"` (questions
   that miss the KB, so each one goes KB check, rules, local), interleaved round by round.

`gateway_bench` runs them and returns one report; benchmarks.gateway_report's `targets_evaluate`
sets the issue's targets against it and its `summary_text` lays it out for a terminal. The stack
itself is benchmarks.stack's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from benchmarks.cpu import CpuProbe
from benchmarks.gateway_report import targets_evaluate
from benchmarks.loadgen import Level, LoadOptions, Target, level_run
from benchmarks.loadgen_rounds import benchmark_run
from benchmarks.prompts import PromptSource, prompts_builtin
from benchmarks.stats import finite, median

# Distinct wordings of demo KB questions, none of them a phrasing of its entry: the vector road
# answers them. Which of them hit is checked against the bench KB before they are used.
PARAPHRASES = [
    "How can I cancel an order?",
    "I want to cancel my order please",
    "How can I reset my password?",
    "I forgot my password, what do I do?",
    "When is your support open?",
    "What are the support opening hours?",
    "How do I stop my subscription?",
    "How can I cancel my subscription?",
    "What does LoRA stand for?",
    "Can I cancel an order?",
]


@dataclass(frozen=True)
class Plan:
    """What to run; the command's options."""

    levels: tuple[int, ...] = (1, 16, 64, 256)
    max_tokens: int = 64
    rounds: int = 3
    num_requests: int | None = None  # per level and target; None: max(4c, 32)
    kb_requests: int = 50
    long_requests: int = 5
    long_tokens: int = 512
    timeout: float = 120.0
    max_duration: float = 300.0
    cooldown: float = 1.0
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class Gateway:
    """The gateway and engine under test, as the benchmark reaches them."""

    url: str  # without /v1
    api_key: str
    pid: int  # the root of the gateway's process tree, for CPU accounting
    engine_url: str  # without /v1
    engine_model: str


def _strip(run: dict) -> dict:
    # Each request's chunk times would make the report megabytes long; the level's figures stay.
    return {key: value for key, value in run.items() if key != "requests"}


def _fixed(texts: list[str]) -> list[list[dict]]:
    # As asked, no reference added: an exact KB question must stay exact.
    return [[{"role": "user", "content": text}] for text in texts]


def _kb_row(run: dict) -> dict:
    m = run["metrics"]
    return {
        "requests": m["completed"] + m["failed"] + m["unfinished"],
        "completed": m["completed"],
        "failed": m["failed"] + m["unfinished"],
        "errors": m["errors"],
        "routes": m["routes"],
        "p50_ms": m["median_e2el_ms"],
        "p99_ms": m["p99_e2el_ms"],
        "mean_ms": m["mean_e2el_ms"],
        "output_tokens_per_answer": m["total_output_tokens"] / m["completed"]
        if m["completed"]
        else None,
    }


def case_variants(texts: list[str], *, count: int) -> list[str]:
    """`count` texts: each of `texts` with one more letter's case swapped, round robin.

    The embedding model lowercases its input, so a variant scores exactly as its original does;
    but the gateway's query-vector cache is keyed by the text as asked, so each variant costs a
    model call, as a new user's wording does. Repeating one paraphrase would time the cache.
    """
    out: list[str] = []
    positions = [[i for i, ch in enumerate(text) if ch.isalpha()] for text in texts]
    step = 0
    while len(out) < count and texts:
        for text, letters in zip(texts, positions):
            if len(out) >= count:
                break
            if step == 0:
                out.append(text)
            elif step <= len(letters):
                i = letters[step - 1]
                out.append(text[:i] + text[i].swapcase() + text[i + 1 :])
        step += 1
        if step > max(len(p) for p in positions) + 1:
            break  # every letter used: fewer texts than asked, rather than repeats
    return out


async def _alone(*, target: Target, conversations: list[list[dict]], options: LoadOptions) -> dict:
    return await level_run(
        target=target, level=Level(concurrency=1), conversations=conversations, options=options
    )


async def first_question(*, gateway: Gateway, question: str, timeout: float) -> dict:
    """One exact KB question, as the first request the gateway serves."""
    target = Target(
        base_url=gateway.url + "/v1", api_key=gateway.api_key, model="auto", name="gateway"
    )
    options = LoadOptions(max_tokens=64, timeout=timeout, warmup=0, progress=False)
    run = await _alone(target=target, conversations=_fixed([question]), options=options)
    row = _kb_row(run)
    return {"question": question, "latency_ms": row["p50_ms"], **row}


async def kb_section(
    *,
    gateway: Gateway,
    plan: Plan,
    exact: list[str],
    paraphrases: list[str],
    long_prompts: PromptSource,
) -> dict:
    """KB hits (exact, then vector) and generated long answers, one request at a time."""
    target = Target(
        base_url=gateway.url + "/v1", api_key=gateway.api_key, model="auto", name="gateway"
    )
    kb_options = LoadOptions(
        max_tokens=64,
        timeout=plan.timeout,
        max_duration=plan.max_duration,
        warmup=0,
        progress=plan.progress,
    )
    count = plan.kb_requests
    exact_texts = [exact[i % len(exact)] for i in range(count)] if exact else []
    section: dict = {"kb_requests": count, "long_tokens": plan.long_tokens}
    section["exact"] = section["vector"] = None
    if exact_texts:
        row = _kb_row(
            await _alone(target=target, conversations=_fixed(exact_texts), options=kb_options)
        )
        row["questions"] = sorted(set(exact_texts))
        section["exact"] = row
    if paraphrases:
        row = _kb_row(
            await _alone(target=target, conversations=_fixed(paraphrases), options=kb_options)
        )
        row["paraphrases"] = sorted({p.lower() for p in paraphrases})
        section["vector"] = row
    long_options = LoadOptions(
        max_tokens=plan.long_tokens,
        ignore_eos=True,
        timeout=plan.timeout,
        max_duration=plan.max_duration,
        warmup=0,
        progress=plan.progress,
    )
    section["long"] = _kb_row(
        await _alone(
            target=target,
            conversations=long_prompts.take(count=plan.long_requests),
            options=long_options,
        )
    )
    long_p50 = section["long"]["p50_ms"]
    for key in ("exact", "vector"):
        kb = section[key]
        section[f"long_over_{key}"] = (
            long_p50 / kb["p50_ms"]
            if kb and finite(kb["p50_ms"]) and kb["p50_ms"] and finite(long_p50)
            else None
        )
    return section


async def pair_section(*, gateway: Gateway, plan: Plan, long_prompts: PromptSource) -> dict:
    """Makespan of two concurrent long answers over that of one, through the gateway, per round."""
    target = Target(
        base_url=gateway.url + "/v1", api_key=gateway.api_key, model="auto", name="gateway"
    )
    options = LoadOptions(
        max_tokens=plan.long_tokens,
        ignore_eos=True,
        timeout=plan.timeout,
        max_duration=plan.max_duration,
        warmup=0,
        progress=False,
    )
    rounds = []
    for _ in range(plan.rounds):
        one = await level_run(
            target=target,
            level=Level(concurrency=1),
            conversations=long_prompts.take(count=1),
            options=options,
        )
        await asyncio.sleep(plan.cooldown)
        two = await level_run(
            target=target,
            level=Level(concurrency=2),
            conversations=long_prompts.take(count=2),
            options=options,
        )
        await asyncio.sleep(plan.cooldown)
        m1, m2 = one["metrics"], two["metrics"]
        rounds.append(
            {
                "one_s": m1["duration"],
                "two_s": m2["duration"],
                "ratio": m2["duration"] / m1["duration"] if m1["duration"] else None,
                "failed": m1["failed"] + m1["unfinished"] + m2["failed"] + m2["unfinished"],
                "routes": {
                    k: m1["routes"].get(k, 0) + m2["routes"].get(k, 0)
                    for k in {*m1["routes"], *m2["routes"]}
                },
                "output_tokens": m1["total_output_tokens"] + m2["total_output_tokens"],
            }
        )
    return {
        "rounds": rounds,
        "long_tokens": plan.long_tokens,
        "one_s": median([r["one_s"] for r in rounds]),
        "two_s": median([r["two_s"] for r in rounds]),
        "ratio": median([r["ratio"] for r in rounds]),
        "failed": sum(r["failed"] for r in rounds),
    }


async def sweep_section(
    *,
    gateway: Gateway,
    plan: Plan,
    model: str,
    on_run: Callable[[dict], None],
    on_note: Callable[[str], None],
) -> dict:
    """The gateway with `model` against the engine directly, at each level, interleaved by round."""
    probe = CpuProbe(roots=(gateway.pid,), note=f"the gateway's process tree (pid {gateway.pid})")
    name = f"gateway:{model}"
    targets = [
        Target(
            base_url=gateway.url + "/v1", api_key=gateway.api_key, model=model, name=name, cpu=probe
        ),
        Target(base_url=gateway.engine_url + "/v1", model=gateway.engine_model, name="engine"),
    ]
    # ignore_eos on both roads: every answer is max_tokens long whatever the model says (a real
    # base model ends most at once), so the two roads are compared on the same work.
    options = LoadOptions(
        max_tokens=plan.max_tokens,
        num_requests=plan.num_requests,
        timeout=plan.timeout,
        max_duration=plan.max_duration,
        seed=plan.seed,
        cooldown=plan.cooldown,
        warmup=1,
        progress=plan.progress,
        ignore_eos=True,
    )
    # Short chat messages, each made unique (see benchmarks.prompts): none is in the KB, so
    # `auto` takes the whole road to the engine for every one.
    report = await benchmark_run(
        targets=targets,
        levels=[Level(concurrency=c) for c in plan.levels],
        prompts=prompts_builtin(name="chat", seed=plan.seed),
        options=options,
        rounds=plan.rounds,
        on_run=on_run,
        on_note=on_note,
    )
    by = {(row["target"], row["label"]): row for row in report["summary"]}
    levels = []
    for row in report["compare"]:
        gw, engine = by.get((name, row["label"]), {}), by.get(("engine", row["label"]), {})
        levels.append(
            {
                "label": row["label"],
                "concurrency": row["x"],
                "rounds": row["rounds"],
                "engine_ttft_p50_ms": engine.get("median_ttft_ms"),
                "gateway_ttft_p50_ms": gw.get("median_ttft_ms"),
                "engine_ttft_p99_ms": engine.get("p99_ttft_ms"),
                "gateway_ttft_p99_ms": gw.get("p99_ttft_ms"),
                "added_ttft_p50_ms": row["added_ttft_p50_ms"],
                "added_ttft_p99_ms": row["added_ttft_p99_ms"],
                "engine_output_throughput": engine.get("output_throughput"),
                "gateway_output_throughput": gw.get("output_throughput"),
                "output_throughput_ratio": row["output_throughput_ratio"],
                "gateway_failed": gw.get("failed", 0) + gw.get("unfinished", 0),
                "engine_failed": engine.get("failed", 0) + engine.get("unfinished", 0),
                "gateway_errors": gw.get("errors", {}),
                "engine_errors": engine.get("errors", {}),
                "gateway_cpu_ms_per_request": gw.get("gateway_cpu_ms_per_request"),
                "routes": gw.get("routes", {}),
                "route_targets": _route_targets(report, name, row["label"]),
            }
        )
    return {
        "model": model,
        "levels": levels,
        "benchmark": report["benchmark"],
        "targets": report["targets"],
        "runs": [_strip(run) for run in report["runs"]],
    }


def _route_targets(report: dict, name: str, label: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in report["runs"]:
        if run["target"] == name and run["label"] == label:
            for key, n in run["metrics"]["route_targets"].items():
                counts[key] = counts.get(key, 0) + n
    return counts


async def gateway_bench(
    *,
    gateway: Gateway,
    plan: Plan,
    first: str,
    exact: list[str],
    paraphrases: list[str],
    classify: Callable[[list[str]], list[str]] | None = None,
    say: Callable[[str], None] = lambda text: None,
    on_run: Callable[[dict], None] | None = None,
) -> dict:
    """Every part, in order; the report. `classify` keeps the paraphrases the vector road answers
    (it runs after the first question, so that one is the gateway's first request)."""
    report: dict = {
        "plan": asdict(plan),
        "load_average_start": list(os.getloadavg()),
        "cpus": os.cpu_count(),
    }
    say("first question after the start ...")
    report["first_question"] = await first_question(
        gateway=gateway, question=first, timeout=plan.timeout
    )
    if classify is not None:
        # In a thread: it uses the ORM, which refuses to run inside the event loop.
        paraphrases = await asyncio.to_thread(classify, paraphrases)
    long_prompts = prompts_builtin(name="long", seed=plan.seed)
    say(f"KB hits and {plan.long_tokens}-token answers, one at a time ...")
    report["kb"] = await kb_section(
        gateway=gateway, plan=plan, exact=exact, paraphrases=paraphrases, long_prompts=long_prompts
    )
    say(f"two concurrent {plan.long_tokens}-token answers against one ...")
    report["pair"] = await pair_section(gateway=gateway, plan=plan, long_prompts=long_prompts)
    report["sweep"] = {}
    for key, model in (("named", "local"), ("auto", "auto")):
        say(f"concurrency sweep, model {model!r} against the engine ...")
        report["sweep"][key] = await sweep_section(
            gateway=gateway,
            plan=plan,
            model=model,
            on_run=on_run or (lambda run: None),
            on_note=say,
        )
    report["load_average_end"] = list(os.getloadavg())
    report["targets"] = targets_evaluate(report=report)
    return report


def plan_quick(plan: Plan) -> Plan:
    """A few seconds' worth of everything, for a test: what runs is the same, the sizes shrink."""
    return replace(
        plan,
        levels=(1, 4),
        max_tokens=8,
        rounds=1,
        num_requests=8,
        kb_requests=5,
        long_requests=1,
        long_tokens=32,
        cooldown=0.2,
    )
