"""Prompt assembly: system prompt, KB context with citation labels, history trimmed to fit."""

from __future__ import annotations

import math
import re

from core.text import CJK_RANGES
from knowledge.selectors import ContextPassage

_CJK = re.compile(f"[{CJK_RANGES}]")
_MESSAGE_OVERHEAD = 4  # role markers and separators of a chat template


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate that errs high: CJK characters count one each, other text
    one per three characters (real BPE vocabularies average about four)."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 3)


def message_tokens(message: dict) -> int:
    return approx_tokens(message.get("content") or "") + _MESSAGE_OVERHEAD


def system_message(prompt: str, passages: list[ContextPassage]) -> str:
    if not passages:
        return prompt
    blocks = "\n\n".join(f"[{p.label}]\n{p.text}" for p in passages)
    return (f"{prompt}\n\nUse the following knowledge-base passages when they help, and cite a passage by its "
            f"label in square brackets when you use it.\n\n{blocks}")


def build_messages(*, system: str, history: list[dict], question: str, budget: int) -> tuple[list[dict], int]:
    """Messages within `budget` tokens: system and question always, then the most recent
    history turns that still fit. Returns (messages, history turns dropped)."""
    head = [{"role": "system", "content": system}] if system else []
    tail = [{"role": "user", "content": question}]
    used = sum(message_tokens(m) for m in head + tail)
    kept: list[dict] = []
    for message in reversed(history):
        cost = message_tokens(message)
        if used + cost > budget:
            break
        kept.insert(0, message)
        used += cost
    # A conversation must not start with an orphaned assistant turn.
    while kept and kept[0].get("role") == "assistant":
        kept.pop(0)
    return head + kept + tail, len(history) - len(kept)
