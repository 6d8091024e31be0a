"""The prompts of a benchmark: built-in sets, or a JSONL file, handed out one per request.

Each request gets a question no other request of the run asked (unless --repeat-prompts): a
short reference is added to the last user message, with a tag drawn for the run, so neither
the KB's exact match, nor the query-embedding cache, nor an engine's prefix cache of a whole
prompt answers from what an earlier request (or an earlier run) left behind. The base prompts
cycle in a seeded order, so two targets of a comparison see the same mix of lengths.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

KB_QUESTIONS = [
    "How do I cancel my order?",
    "How do I cancel my subscription?",
    "How do I reset my password?",
    "What are your support hours?",
    "How long does delivery take?",
    "Can I change the delivery address after ordering?",
    "How do I download an invoice?",
    "Which payment methods do you accept?",
    "How do I return a product?",
    "When will I get my refund?",
    "How do I change the e-mail address of my account?",
    "Do you ship outside the European Union?",
    "How do I enable two-factor authentication?",
    "Can I pause my subscription?",
    "What is LoRA?",
    "What is QLoRA?",
    "How do I delete my account?",
    "Where can I see the status of my order?",
    "Is there a student discount?",
    "How do I add a team member to my plan?",
    "What happens when my card payment fails?",
    "How do I export my data?",
    "Can I get a paper invoice?",
    "How do I contact a human agent?",
]

CHAT_MESSAGES = [
    "Hi! Can you help me with something?",
    "Thanks, that worked.",
    "Tell me a short joke about databases.",
    "Summarize the benefits of unit tests in two sentences.",
    "What's a good name for a grey cat?",
    "Give me three tips for a quick lunch.",
    "Translate 'good morning' into French and Spanish.",
    "Is it better to rent or to buy a bike for a month?",
    "Explain what an API is to a ten-year-old.",
    "Write a haiku about Monday mornings.",
    "What should I pack for a weekend in the mountains?",
    "Recommend a board game for four players.",
]

_PASSAGES = [
    "Our returns policy covers every product bought in the online shop or in a store. A product "
    "can be returned within thirty days of delivery, unused and in its original packaging, with "
    "the order number. Products made to measure, opened software and gift cards cannot be "
    "returned. Returns are free inside the European Union; from other countries the customer pays "
    "the postage. The refund goes to the original payment method within fourteen days of the "
    "return reaching the warehouse; a partial refund applies when a product comes back damaged or "
    "incomplete. Exchanges are handled as a return and a new order, so the new product ships as "
    "soon as it is ordered, without waiting for the return. Customers with a business account can "
    "return products within sixty days and may ask for a collection from their premises.",
    "The subscription has three plans. Starter is for one person and includes the assistant, the "
    "knowledge base and e-mail support. Team adds up to twenty members, shared sessions, an admin "
    "console, usage reports and support by chat on working days. Enterprise adds single sign-on, "
    "a dedicated instance, a service-level agreement with credits for downtime, audit logs kept "
    "for a year and a named contact. Plans are billed monthly or yearly; a yearly plan costs ten "
    "months. Changing to a larger plan takes effect at once and is charged pro rata; changing to "
    "a smaller one takes effect at the next renewal. A cancelled subscription keeps working until "
    "the end of the paid period, and its data can be exported for ninety days after that, then it "
    "is deleted.",
    "Incident report. At the start of the evening peak the answer latency of the assistant rose "
    "from under a second to about eight seconds, and some answers failed. The local model server "
    "had been restarted with a smaller memory budget after a configuration change, so it could "
    "batch fewer requests at once and the rest queued. The gateway's circuit breaker opened after "
    "repeated timeouts and sent new requests to the external model, which kept the service up but "
    "raised costs. The configuration was rolled back within forty minutes and latency returned to "
    "normal. Follow-ups: alert on queue length, not only on errors; test configuration changes "
    "under load before the evening; document the memory budget next to the model's settings.",
]
_TASKS = [
    "Summarize the text above in five bullet points for a customer.",
    "Write a detailed FAQ of eight questions and answers based on the text above.",
    "Rewrite the text above as a friendly e-mail to a customer who asked about it.",
    "List every rule in the text above, then explain the reason a business might have for each.",
]
LONG_PROMPTS = [f"{passage}\n\n{task}" for passage in _PASSAGES for task in _TASKS] + [
    (
        "Write a detailed, step-by-step guide to moving a small web shop from shared hosting to "
        "a cloud provider."
    ),
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in depth how a search engine ranks pages, for a reader with no technical background.",
    "Write an essay on the advantages and the risks of working from home, with examples.",
]

DATASETS = {"kb": KB_QUESTIONS, "chat": CHAT_MESSAGES, "long": LONG_PROMPTS}


class PromptError(ValueError):
    pass


class PromptSource:
    """Hands out conversations (lists of chat messages), a fresh one for every request."""

    def __init__(
        self, *, conversations: list[list[dict]], name: str, repeat: bool = False, seed: int = 0
    ):
        if not conversations:
            raise PromptError("the prompt set is empty")
        self.name = name
        self.repeat = repeat
        order = list(range(len(conversations)))
        random.Random(seed).shuffle(order)
        self._conversations = [conversations[i] for i in order]
        self._position = 0
        self._references = 0
        # A tag per run, not per seed: a second run with the same seed must not find its
        # questions in the caches the first one filled.
        self.run_tag = f"{random.SystemRandom().randrange(10_000, 100_000)}"

    @property
    def position(self) -> int:
        """Where the next batch starts in the cycle of base prompts."""
        return self._position

    def advance(self, *, count: int) -> None:
        self._position += count

    def take(self, *, count: int, start: int | None = None) -> list[list[dict]]:
        """`count` conversations from the cycle of base prompts: from `start` if given (the
        position stays), else from the position (which moves on). Each is made unique."""
        first = self._position if start is None else start
        if start is None:
            self._position += count
        batch = []
        for offset in range(count):
            conversation = self._conversations[(first + offset) % len(self._conversations)]
            self._references += 1
            if not self.repeat:
                conversation = _with_reference(
                    conversation, f"ref. {self.run_tag}-{self._references}"
                )
            batch.append(conversation)
        return batch


def prompts_builtin(*, name: str, repeat: bool = False, seed: int = 0) -> PromptSource:
    if name not in DATASETS:
        raise PromptError(f"unknown dataset {name!r}; built-in: {', '.join(DATASETS)}")
    conversations = [[{"role": "user", "content": text}] for text in DATASETS[name]]
    return PromptSource(conversations=conversations, name=name, repeat=repeat, seed=seed)


def prompts_load(*, path: Path, repeat: bool = False, seed: int = 0) -> PromptSource:
    """A JSONL file, one request per line: {"prompt": "..."} or {"messages": [...]}."""
    conversations = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptError(f"cannot read {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{path}:{number}: not JSON ({exc})") from None
        if isinstance(record, dict) and isinstance(record.get("prompt"), str):
            conversations.append([{"role": "user", "content": record["prompt"]}])
        elif isinstance(record, dict) and _valid_messages(record.get("messages")):
            conversations.append(record["messages"])
        else:
            raise PromptError(
                f'{path}:{number}: expected {{"prompt": "..."}} or {{"messages": [...]}} '
                "ending with a user message"
            )
    return PromptSource(conversations=conversations, name=str(path), repeat=repeat, seed=seed)


def _valid_messages(messages) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
            for m in messages
        )
        and messages[-1]["role"] == "user"
    )


def _with_reference(conversation: list[dict], reference: str) -> list[dict]:
    last = conversation[-1]
    if not isinstance(last.get("content"), str):
        # Content as a list of parts: add the reference as one more text part.
        parts = [*(last.get("content") or []), {"type": "text", "text": f"({reference})"}]
        return [*conversation[:-1], {**last, "content": parts}]
    return [*conversation[:-1], {**last, "content": f"{last['content']} ({reference})"}]
