"""The typo set and its near misses, for the typo road (knowledge.typos).

The typos are made from the English FAQ phrasings of the labelled KB (benchmarks/kb_labelled), by
a seeded generator, so the set is the same on every machine: for each phrasing, one character
off in one word (a letter dropped, doubled, swapped with its neighbour, or replaced by a key next
to it on a QWERTY keyboard), two characters off (phrasings of ten characters or more: one in each
of two words, or two in a word of eight letters or more), and a spacing variant (two words run
together, or one split). The first letter of a word is left as typed: people seldom miss it, and
the road does not guess it. A typo that happens to spell a real word stays in the set and counts
against the road, which takes it for another word.

The near misses are one or two characters off a phrasing too, and mean something else: with the
KB lacking that meaning, each must get no direct answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ENTRIES = Path(__file__).resolve().parent / "kb_labelled" / "entries.jsonl"
SEED = 27

_NEIGHBOURS = {
    row[i]: row[max(0, i - 1)] + row[i + 1 : i + 2]
    for row in ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    for i in range(len(row))
}


@dataclass(frozen=True)
class Case:
    question: str
    expected: str | None  # the labelled entry's id, or None: no direct answer
    kind: str  # "one", "two", "spacing", or "near_miss"
    phrasing: str  # the phrasing it was made from (or is close to)


def english_faq_phrasings() -> list[tuple[str, str]]:
    """(entry id, phrasing) of every English FAQ phrasing of the labelled KB."""
    pairs = []
    for line in ENTRIES.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind", "faq") != "faq":
            continue
        for text in [entry["question"], *entry.get("aliases", [])]:
            if text.isascii():
                pairs.append((entry["id"], text))
    return pairs


def _edit_word(word: str, rng: random.Random) -> str:
    """`word` one character off, its first letter kept."""
    i = rng.randrange(1, len(word))
    op = rng.choice(("drop", "double", "swap", "neighbour"))
    if op == "drop":
        return word[:i] + word[i + 1 :]
    if op == "double":
        return word[:i] + word[i] + word[i:]
    if op == "swap" and i < len(word) - 1 and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    near = _NEIGHBOURS.get(word[i].lower())
    if not near:
        return word[:i] + word[i + 1 :]
    return word[:i] + rng.choice(near) + word[i + 1 :]


def _editable(words: list[str]) -> list[int]:
    return [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]


def _typo(text: str, rng: random.Random, edits: int) -> str | None:
    """`text` with `edits` words one character off; two in one word only when it is the one word
    long enough to edit and has eight letters or more."""
    words = text.split(" ")
    places = _editable(words)
    if not places:
        return None
    if len(places) >= edits:
        chosen = rng.sample(places, edits)
    elif len(words[places[0]]) >= 8:
        chosen = places * edits
    else:
        return None
    for i in chosen:
        words[i] = _edit_word(words[i], rng)
    return " ".join(words)


def _spacing(text: str, rng: random.Random) -> str | None:
    words = text.split(" ")
    if len(words) >= 3 and rng.random() < 0.5:
        i = rng.randrange(1, len(words) - 1)
        return " ".join([*words[:i], words[i] + words[i + 1], *words[i + 2 :]])
    places = [i for i, w in enumerate(words) if len(w) >= 6 and w.isalpha()]
    if not places:
        return None
    i = rng.choice(places)
    cut = rng.randrange(3, len(words[i]) - 2)
    return " ".join([*words[:i], words[i][:cut], words[i][cut:], *words[i + 1 :]])


def typo_cases(seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for entry_id, phrasing in english_faq_phrasings():
        made = [("one", _typo(phrasing, rng, 1)), ("spacing", _spacing(phrasing, rng))]
        if len(phrasing) >= 10:
            made.append(("two", _typo(phrasing, rng, 2)))
        for kind, question in made:
            if question and question != phrasing:
                cases.append(Case(question, entry_id, kind, phrasing))
    return cases


# (question, the phrasing it is close to, and the entries to leave out of the KB so that the
# question's own meaning has no entry). Each is one or two characters off its phrasing.
NEAR_MISSES: list[tuple[str, str]] = [
    ("What is QLoRA?", "What is LoRA?"),
    ("delete my cart", "delete my card"),
    ("How do I add a payment cart?", "How do I add a payment card?"),
    ("How do I remove a saved payment cart?", "How do I remove a saved payment card?"),
    ("Which payment methods do you expect?", "Which payment methods do you accept?"),
    ("forgot passport", "forgot password"),
    ("What is the KV cash?", "What is the KV cache?"),
    ("What is continuous matching?", "What is continuous batching?"),
    ("shop my subscription", "stop my subscription"),
    ("clone my account", "close my account"),
    ("what does lore mean", "what does LoRA mean"),
    ("How do I invoke an API key?", "How do I revoke an API key?"),
    ("spend something back", "send something back"),
    ("switch to a cheaper plant", "switch to a cheaper plan"),
    ("enable 3FA", "enable 2FA"),
    ("428 Too Many Requests", "429 Too Many Requests"),
    ("How do I trace my order?", "How do I track my order?"),
    ("upgrade to prod", "upgrade to Pro"),
    ("How do I turn of two-factor authentication?", "How do I turn on two-factor authentication?"),
    ("can I pay with PayPay", "can I pay with PayPal"),
    ("How do I create an API kit?", "How do I create an API key?"),
    ("get an API keg", "get an API key"),
]


def near_miss_cases() -> list[Case]:
    return [Case(question, None, "near_miss", phrasing) for question, phrasing in NEAR_MISSES]
