"""Multi-turn conversations through the gateway, for the engine's prefix cache: shared by
`manage.py bench_prefix` and its test.

Each conversation is asked turn after turn, as a client of `/v1` does: the whole conversation so
far, then the next question. Conversations run side by side. What is measured is what a user
waits for, the time to the first token of each turn, and what the engine says it reused, the
change of its prefix-cache counters over the run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.request
from dataclasses import dataclass, field

import openai

from inference_ops.probes import parse_metrics

# A system prompt of about a thousand tokens, as a domain's rule has one: the product's facts
# and the house style. The same for every turn of every conversation on the rule.
_POLICY = (
    "Orders ship within two working days from the warehouse nearest to the customer. "
    "Refunds are paid to the original payment method within five working days of the return "
    "being received. Subscriptions renew monthly and can be cancelled at any time from the "
    "account page; a cancelled subscription stays active until the end of the period paid for. "
)
SYSTEM_PROMPT = (
    "You are the support assistant of a shop. Answer in one or two short sentences, in the "
    "customer's language, and never invent a policy. The policies follow.\n\n" + _POLICY * 12
)

# Questions no KB entry answers (they must reach the engine), one list per conversation.
TOPICS = ["lighthouses", "tides", "harbours", "glaciers", "deserts", "volcanoes", "rivers", "reefs"]
FOLLOW_UPS = [
    "Tell me one thing about {topic}.",
    "And why is that?",
    "Say it in fewer words.",
    "What else should I know?",
    "Thank you. One last fact?",
    "Can you sum up our talk?",
]


@dataclass
class Conversations:
    ttft_ms: dict[int, list[float]] = field(default_factory=dict)  # turn (1-based) -> TTFTs
    queries: float = 0.0  # prompt tokens looked up in the prefix cache during the run
    hits: float = 0.0  # of them, found there
    failed: int = 0  # turns the gateway refused or that broke off (the conversation stops)
    empty: int = 0  # answers with no text (a small model may end at once): no TTFT, goes on

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.queries if self.queries else None

    def ttft_p50(self, turns: range) -> float | None:
        values = [v for turn in turns for v in self.ttft_ms.get(turn, [])]
        return statistics.median(values) if values else None


def engine_counters(engine_url: str) -> tuple[float, float]:
    """The engine's prefix-cache counters now: (queries, hits), in tokens."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=10) as response:
        found = parse_metrics(response.read().decode("utf-8", "replace"))
    return found.get("prefix_cache_queries", 0.0), found.get("prefix_cache_hits", 0.0)


async def converse(
    *, url: str, key: str, engine_url: str, conversations: int, turns: int, max_tokens: int
) -> Conversations:
    """`conversations` conversations of `turns` turns through the gateway at `url`, side by
    side; each turn's TTFT and the engine's prefix-cache counters over the run."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
    result = Conversations()
    before = await asyncio.to_thread(engine_counters, engine_url)

    async def one(index: int) -> None:
        topic = TOPICS[index % len(TOPICS)]
        history: list[dict] = []
        for turn in range(1, turns + 1):
            question = FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)].format(topic=topic)
            messages = [*history, {"role": "user", "content": question}]
            started, first, parts = time.perf_counter(), None, []
            try:
                stream = await client.chat.completions.create(
                    model="auto", messages=messages, max_tokens=max_tokens, stream=True
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        if first is None:
                            first = time.perf_counter()
                        parts.append(chunk.choices[0].delta.content)
            except openai.APIError:
                result.failed += 1
                return
            if first is None:
                result.empty += 1
            else:
                result.ttft_ms.setdefault(turn, []).append((first - started) * 1000)
            history = [*messages, {"role": "assistant", "content": "".join(parts)}]

    try:
        await asyncio.gather(*(one(index) for index in range(conversations)))
    finally:
        await client.close()
    after = await asyncio.to_thread(engine_counters, engine_url)
    result.queries, result.hits = after[0] - before[0], after[1] - before[1]
    return result
