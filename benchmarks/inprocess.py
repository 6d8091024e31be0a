"""The old design, measured: the model inside the web process, transformers' `generate()` behind
one global lock, so the server makes one answer at a time.

A script for the engine venv's python (torch and transformers of vLLM's versions live there, not
in the app's venv); it imports nothing of Django or of the project:

    <vllm python> benchmarks/inprocess.py --model-dir DIR [--tokens 256] [--threads 1]
        [--concurrency 1,2] [--rounds 1] [--prompts FILE.json]

It loads the model, makes one uncounted warm-up answer, then in each round, for each concurrency
c, asks c answers at once from c threads and prints one JSON line per measurement: the makespan
(from the common start until every answer is done) and each answer's own time and token counts.
Every answer is greedy and exactly --tokens long (`min_new_tokens` equals `max_new_tokens`), so
the figures do not depend on where the model would have stopped.

`--prompts` is a JSON list of conversations (lists of chat messages), used in order: the first for
the warm-up, then the next c for each measurement; without it a built-in long-answer prompt is
used for every answer. `manage.py bench_inprocess` runs this one round at a time between the vLLM
server's rounds, with the same conversations; the report's arithmetic (medians, ratios, text) is
here too, so both ends read the figures the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DEFAULT_PROMPT = [
    {
        "role": "user",
        "content": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    }
]
WARMUP_TOKENS = 16  # enough to go through prefill and decode once; not part of any figure
SIDES = ("before", "after")


def concurrency_list(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of positive integers, got {text!r}"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of positive integers, got {text!r}"
        )
    return levels


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer above 0, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"an integer above 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Answer:
    seconds: float  # from the measurement's common start: the lock's wait included, as a user waits
    prompt_tokens: int
    output_tokens: int


class LockedModel:
    """The old design's model: one instance shared by every request, `generate()` under a lock
    because a transformers model is not safe to run from two threads at once."""

    def __init__(self, *, model_dir: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Before the load: the thread pool is made on first use and keeps its size.
        torch.set_num_threads(threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        self.model.eval()
        self.lock = threading.Lock()

    def answer(self, *, messages: list[dict], tokens: int) -> tuple[int, int]:
        """(prompt tokens, output tokens) of one greedy answer of exactly `tokens` tokens."""
        inputs = self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        prompt_tokens = int(inputs["input_ids"].shape[1])
        with self.lock, self.torch.inference_mode():
            output = self.model.generate(
                **inputs, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens
            )
        return prompt_tokens, int(output.shape[1]) - prompt_tokens


def measure(*, model: LockedModel, conversations: list[list[dict]], tokens: int) -> dict:
    """Makespan of `len(conversations)` answers asked at once, one thread each, as the web server's
    request threads would."""
    answers: list[Answer | None] = [None] * len(conversations)
    errors: list[BaseException] = []
    # Every thread is created and waiting before the clock starts, so the first one does not get
    # a head start the others would not have had.
    gate = threading.Barrier(len(conversations) + 1)
    start = 0.0

    def ask(index: int) -> None:
        gate.wait()
        try:
            prompt_tokens, output_tokens = model.answer(
                messages=conversations[index], tokens=tokens
            )
            answers[index] = Answer(
                seconds=time.perf_counter() - start,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
        except BaseException as exc:  # noqa: BLE001 - the main thread raises it again
            # Every failure, not only Exception: one escaping a thread is only printed. The main
            # thread raises the first one again, so the run exits non-zero with its cause.
            errors.append(exc)

    threads = [
        threading.Thread(target=ask, args=(index,), daemon=True)
        for index in range(len(conversations))
    ]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    gate.wait()
    for thread in threads:
        thread.join()
    makespan = time.perf_counter() - start
    if errors:
        raise errors[0]
    return {
        "concurrency": len(conversations),
        "makespan_s": makespan,
        "answers": [answer.__dict__ for answer in answers],
    }


def _conversations(prompts: list[list[dict]] | None) -> Iterator[list[dict]]:
    position = 0
    while True:
        yield prompts[position % len(prompts)] if prompts else DEFAULT_PROMPT
        position += 1


def run(
    *,
    model_dir: str,
    tokens: int,
    threads: int,
    levels: list[int],
    rounds: int,
    prompts: list[list[dict]] | None,
    emit: Callable[[dict], None],
) -> None:
    import torch
    import transformers

    started = time.perf_counter()
    model = LockedModel(model_dir=model_dir, threads=threads)
    emit(
        {
            "event": "loaded",
            "seconds": time.perf_counter() - started,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
            "dtype": str(model.model.dtype),
        }
    )
    source = _conversations(prompts)
    warmup = measure(model=model, conversations=[next(source)], tokens=min(tokens, WARMUP_TOKENS))
    emit({"event": "warmup", **warmup})
    for round_number in range(1, rounds + 1):
        for level in levels:
            result = measure(
                model=model, conversations=[next(source) for _ in range(level)], tokens=tokens
            )
            short = [a["output_tokens"] for a in result["answers"] if a["output_tokens"] != tokens]
            if short:
                raise RuntimeError(f"answers of {short} tokens where {tokens} were asked")
            emit({"event": "run", "round": round_number, **result})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", required=True, help="a model folder in Hugging Face's format"
    )
    parser.add_argument(
        "--tokens", type=_positive_int, default=256, help="tokens of every answer (default 256)"
    )
    parser.add_argument(
        "--threads", type=_positive_int, default=1, help="torch's intra-op threads (default 1)"
    )
    parser.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=[1, 2],
        help="answers asked at once, one measurement each, e.g. 1 or 2 or 1,2 (default 1,2)",
    )
    parser.add_argument(
        "--rounds", type=_positive_int, default=1, help="times each measurement runs (default 1)"
    )
    parser.add_argument(
        "--prompts", default=None, help="a JSON list of conversations, used in order"
    )
    options = parser.parse_args(argv)
    prompts = None
    if options.prompts:
        with open(options.prompts, encoding="utf-8") as handle:
            prompts = json.load(handle)
        if (
            not isinstance(prompts, list)
            or not prompts
            or not all(isinstance(c, list) and c for c in prompts)
        ):
            parser.error("--prompts must hold a non-empty JSON list of conversations")

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)

    run(
        model_dir=options.model_dir,
        tokens=options.tokens,
        threads=options.threads,
        levels=options.concurrency,
        rounds=options.rounds,
        prompts=prompts,
        emit=emit,
    )
    return 0


# --- the report, shared with manage.py bench_inprocess --------------------------------------------


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summary(*, rounds: list[dict]) -> dict:
    """Medians over rounds of each side's one-answer time and two-answer makespan, and the ratios.

    `rounds` holds, per round, `{"before": {"one_s", "two_s"}, "after": {"one_s", "two_s"}}`.
    Each ratio is taken of the medians, so it matches the seconds printed beside it.
    """
    sides = {}
    for side in SIDES:
        one = _median([r[side]["one_s"] for r in rounds])
        two = _median([r[side]["two_s"] for r in rounds])
        sides[side] = {"one_s": one, "two_s": two, "two_over_one": _ratio(two, one)}
    return {
        **sides,
        "one_before_over_after": _ratio(sides["before"]["one_s"], sides["after"]["one_s"]),
        "two_before_over_after": _ratio(sides["before"]["two_s"], sides["after"]["two_s"]),
    }


def summary_text(*, figures: dict, tokens: int, rounds: int) -> str:
    def seconds(value: float | None) -> str:
        return f"{value:7.2f} s" if value is not None else "      -  "

    def times(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    before, after = figures["before"], figures["after"]
    return "\n".join(
        [
            (
                f"{tokens}-token answers, medians of {rounds} round(s)"
                "        1 alone    2 at once   2 at once / 1 alone"
            ),
            (
                "  before: in-process generate() under a lock   "
                f"{seconds(before['one_s'])}  {seconds(before['two_s'])}"
                f"   {times(before['two_over_one'])}"
            ),
            (
                "  after:  vLLM server over HTTP                "
                f"{seconds(after['one_s'])}  {seconds(after['two_s'])}"
                f"   {times(after['two_over_one'])}"
            ),
            (
                "  before / after                               "
                f"{times(figures['one_before_over_after']):>9}"
                f"  {times(figures['two_before_over_after']):>9}"
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
