"""Multi-turn conversations through the gateway, for the engine's prefix cache: shared by
`manage.py bench_prefix` and its test.

Each conversation is asked turn after turn, as a client of `/v1` does (the whole conversation so
far, then the next question) or as the chat API's stored sessions are (one question a turn, the
gateway replaying the rest); `layouts_compare` sends the same conversations to the engine itself
with `/v1`'s KB passages in each place they could go. Conversations run side by side. What is
measured is what a user waits for, the time to the first token of each turn, and what the engine
says it reused, the change of its prefix-cache counters over the run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import httpx
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


# make run's default rule (its own short system prompt, the demo KB's passages with each question):
# conversations of the demo's domain, whose questions the KB does not answer directly but finds
# passages for, each turn a follow-up of the last.
DEMO_CONVERSATIONS = [
    [
        "My parcel arrived damaged, what should I do?",
        "And who pays the duties when it comes from abroad?",
        "How long does international shipping take?",
        "Thanks. Can you sum that up in one sentence?",
    ],
    [
        "Can I still get my money back for shoes I bought three weeks ago?",
        "And when does the money reach my card?",
        "What about a gift card I bought?",
        "Thanks. Can you sum that up in one sentence?",
    ],
    [
        "I want to stop paying for the monthly plan, how?",
        "And do I lose access right away?",
        "Can I also call off the order I placed this morning?",
        "Thanks. Can you sum that up in one sentence?",
    ],
    [
        "How does fine-tuning with low-rank adapters work?",
        "And what changes when the base model is quantized to 4 bits?",
        "Can one base model serve several adapters at once?",
        "Thanks. Can you sum that up in one sentence?",
    ],
]

# Where a /v1 request's KB passages can go, the client's history being plain questions and
# answers (it never saw the passages): ahead of the question (the gateway's layout), after it, in
# the system message, or as a user message of their own before the question; and "replayed", the
# stored conversation's layout: each earlier question with its own passages as it was sent.
LAYOUTS = (
    "before the question",
    "after the question",
    "in the system message",
    "own message",
    "replayed",
)


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


def engine_cache_reset(engine_url: str) -> bool:
    """Empty the engine's prefix cache (vLLM's /reset_prefix_cache, served in its dev mode only),
    so that a measurement does not find the last one's blocks. False where the engine has no such
    route (the simulator)."""
    request = urllib.request.Request(f"{engine_url}/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status == 200
    except urllib.error.URLError:
        return False


def engine_counters(engine_url: str) -> tuple[float, float]:
    """The engine's prefix-cache counters now: (queries, hits), in tokens."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=10) as response:
        found = parse_metrics(response.read().decode("utf-8", "replace"))
    return found.get("prefix_cache_queries", 0.0), found.get("prefix_cache_hits", 0.0)


def _question(scripts: list[list[str]] | None, index: int, turn: int) -> str:
    if scripts is not None:
        script = scripts[index % len(scripts)]
        return script[(turn - 1) % len(script)]
    return FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)].format(topic=TOPICS[index % len(TOPICS)])


async def converse(
    *,
    url: str,
    key: str,
    engine_url: str,
    conversations: int,
    turns: int,
    max_tokens: int,
    scripts: list[list[str]] | None = None,
    via: str = "v1",
) -> Conversations:
    """`conversations` conversations of `turns` turns through the gateway at `url`, side by
    side; each turn's TTFT and the engine's prefix-cache counters over the run. `scripts`: the
    questions of each conversation (else a topic's follow-ups). `via`: "v1", the client keeping
    the conversation and sending it whole each turn, or "chat", the chat API's stored sessions,
    the gateway keeping it (then TTFT as the gateway stored it)."""
    if via == "chat":
        return await _converse_stored(
            url=url,
            key=key,
            engine_url=engine_url,
            conversations=conversations,
            turns=turns,
            scripts=scripts,
        )
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
    result = Conversations()
    before = await asyncio.to_thread(engine_counters, engine_url)

    async def one(index: int) -> None:
        history: list[dict] = []
        for turn in range(1, turns + 1):
            question = _question(scripts, index, turn)
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


async def _converse_stored(
    *,
    url: str,
    key: str,
    engine_url: str,
    conversations: int,
    turns: int,
    scripts: list[list[str]] | None,
) -> Conversations:
    """converse through the chat API: a session each, one question a turn (its answer's ceiling
    is the rule's, or the gateway's ROUTING_DEFAULT_MAX_TOKENS)."""
    result = Conversations()
    before = await asyncio.to_thread(engine_counters, engine_url)
    headers = {"Authorization": f"Bearer {key}"}

    async def one(http: httpx.AsyncClient, index: int) -> None:
        session = (await http.post(f"{url}/api/chat/sessions/", json={}, headers=headers)).json()
        for turn in range(1, turns + 1):
            reply = await http.post(
                f"{url}/api/chat/sessions/{session['id']}/messages/",
                json={"content": _question(scripts, index, turn)},
                headers=headers,
            )
            answer = reply.json().get("assistant_message") if reply.status_code == 201 else None
            if answer is None or answer.get("status") != "complete":
                result.failed += 1
                return
            if answer.get("road") != "local" or not answer.get("content"):
                result.empty += 1
            elif answer.get("ttft_ms") is not None:
                result.ttft_ms.setdefault(turn, []).append(answer["ttft_ms"])

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(one(http, index) for index in range(conversations)))
    after = await asyncio.to_thread(engine_counters, engine_url)
    result.queries, result.hits = after[0] - before[0], after[1] - before[1]
    return result


def layout_messages(
    layout: str, *, system: str, history: list[dict], question: str, passages: str
) -> list[dict]:
    """The prompt of one /v1 turn with the KB passages where `layout` puts them. `history`: the
    conversation as the client keeps it, or, for "replayed", with each question's passages."""
    from routing.prompt import build_messages, system_message

    budget = 1_000_000  # the bench's conversations fit any window: no trimming here
    head = system_message(system, with_passages=True)
    plain = {"role": "user", "content": question}
    if layout == "after the question":
        plain = {"role": "user", "content": f"{question}\n\n{passages}" if passages else question}
        return build_messages(system=head, history=history, question=plain, budget=budget)[0]
    if layout == "in the system message":
        head = f"{head}\n\n{passages}" if passages else head
        return build_messages(system=head, history=history, question=plain, budget=budget)[0]
    if layout == "own message":
        after = [plain]
        plain = {"role": "user", "content": passages} if passages else plain
        if not passages:
            after = []
        return build_messages(
            system=head, history=history, question=plain, budget=budget, after=after
        )[0]
    return build_messages(
        system=head, history=history, question=plain, budget=budget, passages=passages
    )[0]


async def layouts_compare(
    *,
    engine_url: str,
    model: str,
    system: str,
    passages: dict[str, str],
    conversations: int,
    turns: int,
    max_tokens: int,
    scripts: list[list[str]],
) -> dict[str, Conversations | str]:
    """Each layout's conversations sent to the engine itself, one layout after the other on an
    emptied prefix cache: what each layout lets the engine reuse. `passages`: each question's
    passages block as the gateway would send it. A layout the engine refuses (a chat template
    that wants user and assistant turns to alternate) maps to its error."""
    client = openai.AsyncOpenAI(
        base_url=f"{engine_url}/v1", api_key="-", max_retries=0, timeout=300
    )
    results: dict[str, Conversations | str] = {}
    try:
        for layout in LAYOUTS:
            await asyncio.to_thread(engine_cache_reset, engine_url)
            result = Conversations()
            refused: list[str] = []
            before = await asyncio.to_thread(engine_counters, engine_url)

            async def one(
                index: int,
                layout: str = layout,
                result: Conversations = result,
                refused: list[str] = refused,
            ) -> None:
                sent: list[dict] = []  # as the engine got the questions (for "replayed")
                plain: list[dict] = []  # as a client keeps them
                for turn in range(1, turns + 1):
                    question = _question(scripts, index, turn)
                    messages = layout_messages(
                        layout,
                        system=system,
                        history=sent if layout == "replayed" else plain,
                        question=question,
                        passages=passages.get(question, ""),
                    )
                    started = time.perf_counter()
                    try:
                        reply = await client.chat.completions.create(
                            model=model, messages=messages, max_tokens=max_tokens
                        )
                    except openai.APIError as exc:
                        result.failed += 1
                        refused.append(str(exc)[:160])
                        return
                    result.ttft_ms.setdefault(turn, []).append(
                        (time.perf_counter() - started) * 1000
                    )
                    answer = {
                        "role": "assistant",
                        "content": reply.choices[0].message.content or "",
                    }
                    sent += [messages[-1], answer]
                    plain += [{"role": "user", "content": question}, answer]

            await asyncio.gather(*(one(index) for index in range(conversations)))
            after = await asyncio.to_thread(engine_counters, engine_url)
            result.queries, result.hits = after[0] - before[0], after[1] - before[1]
            results[layout] = refused[0] if refused and not result.ttft_ms else result
    finally:
        await client.close()
    return results


@dataclass
class Load:
    """What the engine got through under a steady load."""

    seconds: float = 0.0
    answered: int = 0
    failed: int = 0
    prompt_tokens: int = 0  # as the engine counted them (usage)
    completion_tokens: int = 0
    queries: float = 0.0  # prefix-cache counters over the load, as for Conversations
    hits: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Prompt and answer tokens a second: what the engine computed, both phases."""
        return (self.prompt_tokens + self.completion_tokens) / self.seconds if self.seconds else 0

    @property
    def completion_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0


def load_prompt(index: int, repeats: int) -> str:
    """A prompt of its own: its first words are the request's number, so no two share a KV block
    and the prefix cache gives nothing; then `repeats` times the shop's policies (about 80 tokens
    each)."""
    return f"Case {index}. Read the policies, then answer.\n\n{_POLICY * repeats}Which applies?"


async def engine_load(
    *,
    engine_url: str,
    model: str,
    requests: int,
    concurrency: int,
    max_tokens: int,
    repeats: int = 6,
    first: int = 0,
) -> Load:
    """`requests` prompts of their own (load_prompt, numbered from `first`) sent to the engine
    itself, `concurrency` at once, each answer run to `max_tokens` (vLLM's `ignore_eos`): the
    engine's throughput where the prefix cache has nothing to give, so what its KV block's size
    costs the computation shows alone."""
    client = openai.AsyncOpenAI(
        base_url=f"{engine_url}/v1", api_key="-", max_retries=0, timeout=600
    )
    result = Load()
    numbers = iter(range(first, first + requests))

    async def worker() -> None:
        for index in numbers:
            try:
                reply = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": load_prompt(index, repeats)}],
                    max_tokens=max_tokens,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
            except openai.APIError:
                result.failed += 1
                continue
            result.answered += 1
            if reply.usage is not None:
                result.prompt_tokens += reply.usage.prompt_tokens
                result.completion_tokens += reply.usage.completion_tokens

    before = await asyncio.to_thread(engine_counters, engine_url)
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    result.seconds = time.perf_counter() - started
    after = await asyncio.to_thread(engine_counters, engine_url)
    result.queries, result.hits = after[0] - before[0], after[1] - before[1]
    return result
