"""The KB benchmark's data: a synthetic KB, its build, and the query sets that time it.

The KB is combinatorial (products x intents x editions), so any size up to its capacity
comes out the same every time and a re-run recognises a KB it built earlier. Its texts are in
benchmarks/kb_synthetic: products.json, intents.json (each with "{p}" for the product),
context.json (the policies and handbooks of the context-only entries) and off_domain.json
(questions no entry answers, a template and its fillers). Query sets are
built so that no string is asked twice in timed runs: the query-embedding LRU must not
flatter the figures.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection, transaction

from knowledge.models import Entry
from knowledge.selectors import direct_answer
from knowledge.services.entries import entry_create

# --- the synthetic KB ---------------------------------------------------------------------------

_DATA = Path(__file__).with_name("kb_synthetic")


def _load(name: str):
    return json.loads((_DATA / name).read_text(encoding="utf-8"))


PRODUCTS: list[str] = _load("products.json")
# Editions only appear above 216 products x 50 intents = 10,800 entries: a model line's
# near-duplicate entries ("Pro robot vacuum" next to "robot vacuum"), as real catalogues have.
EDITIONS = ("", "Pro", "Mini", "Max")


@dataclass(frozen=True)
class Intent:
    key: str
    question: str
    alias: str
    paraphrases: tuple[str, str]
    answer: str


# "{p}" in each text stands for the product.
INTENTS = [
    Intent(**{**row, "paraphrases": tuple(row["paraphrases"])}) for row in _load("intents.json")
]

# The context-only entries: a policy per topic and a handbook per kind, for each category.
_CONTEXT = _load("context.json")
RULE_TOPICS: dict[str, str] = _CONTEXT["rule_topics"]
CATEGORIES: list[str] = _CONTEXT["categories"]
DOCUMENT_KINDS: dict[str, list[str]] = _CONTEXT["document_kinds"]
HANDBOOK_COMMON: list[str] = _CONTEXT["handbook_common"]


@dataclass(frozen=True)
class FaqSpec:
    question: str
    alias: str
    answer: str
    tags: tuple[str, ...]
    paraphrases: tuple[str, str]


def faq_capacity() -> int:
    return len(PRODUCTS) * len(INTENTS) * len(EDITIONS)


def faq_specs(count: int) -> list[FaqSpec]:
    """The first `count` FAQ entries, in a fixed order that mixes products and intents."""
    if not 0 < count <= faq_capacity():
        raise ValueError(f"between 1 and {faq_capacity()} entries")
    pairs = [(p, i) for p in range(len(PRODUCTS)) for i in range(len(INTENTS))]
    # A fixed shuffle: a small KB still holds many intents and products, not the first product's 50.
    random.Random(20240611).shuffle(pairs)
    specs = []
    for edition in EDITIONS:
        for product_index, intent_index in pairs:
            if len(specs) == count:
                return specs
            product = f"{edition} {PRODUCTS[product_index]}".strip()
            intent = INTENTS[intent_index]
            fill = lambda template, product=product: template.replace("{p}", product)  # noqa: E731
            question = fill(intent.question)
            specs.append(
                FaqSpec(
                    question=question[0].upper() + question[1:],
                    alias=fill(intent.alias),
                    answer=fill(intent.answer),
                    tags=(intent.key, PRODUCTS[product_index][:64]),
                    paraphrases=(fill(intent.paraphrases[0]), fill(intent.paraphrases[1])),
                )
            )
    return specs


def context_specs(count: int) -> list[dict]:
    """`count` rule and document entries (context only): policies and handbooks per category."""
    rules = [
        (topic, text, category) for category in CATEGORIES for topic, text in RULE_TOPICS.items()
    ]
    documents = [
        (kind, paragraphs, category)
        for category in CATEGORIES
        for kind, paragraphs in DOCUMENT_KINDS.items()
    ]
    out: list[dict] = []
    while len(out) < count and (rules or documents):
        # Three rules for every two documents.
        if rules and (len(out) % 5 < 3 or not documents):
            topic, text, category = rules.pop(0)
            out.append(
                {
                    "kind": Entry.Kind.RULE,
                    "question": f"{topic} for {category}",
                    "answer": f"{text} This applies to all {category}.",
                    "tags": ["policy"],
                }
            )
        else:
            kind, paragraphs, category = documents.pop(0)
            # Six paragraphs of 150-250 characters: split into two passages, as a real handbook is.
            body = "\n\n".join(
                f"{sentence} For {category}, the exact figures are in each model's data sheet."
                for sentence in [*paragraphs, *HANDBOOK_COMMON]
            )
            out.append(
                {
                    "kind": Entry.Kind.DOCUMENT,
                    "question": f"{category.capitalize()} {kind}",
                    "answer": body,
                    "tags": ["handbook"],
                }
            )
    return out


def context_count(faq_count: int) -> int:
    # "A few hundred" at 10,000 entries; at least a handful in quick mode.
    return min(max(10, faq_count // 40), len(CATEGORIES) * (len(RULE_TOPICS) + len(DOCUMENT_KINDS)))


# --- building the KB ----------------------------------------------------------------------------


def kb_matches(specs: list[FaqSpec], extra: int) -> bool:
    """Is the bench database's KB the one these specs describe?"""
    stored = set(Entry.objects.filter(kind=Entry.Kind.FAQ).values_list("question", flat=True))
    return (
        stored == {spec.question for spec in specs}
        and Entry.objects.exclude(kind=Entry.Kind.FAQ).count() == extra
    )


def kb_build(specs: list[FaqSpec], extra: list[dict]) -> None:
    """Replace the KB by these entries, in one transaction, without vectors.

    Each entry goes through `entry_create`, as a curator's would: the phrasings and passages
    are the product's own, not a copy of its rules that could drift. A statement or more per
    row is slower than bulk inserts, but the KB is built once per size and its embedding,
    which follows, takes far longer.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            # CASCADE reaches phrasings, passages, their vectors and misses; models stay.
            cursor.execute("TRUNCATE knowledge_entry RESTART IDENTITY CASCADE")
        for spec in specs:
            entry_create(
                question=spec.question,
                answer=spec.answer,
                kind=Entry.Kind.FAQ,
                aliases=[spec.alias],
                tags=list(spec.tags),
                embed="none",
            )
        for fields in extra:
            entry_create(**fields, embed="none")


def analyze() -> None:
    with connection.cursor() as cursor:
        for table in (
            "knowledge_entry",
            "knowledge_phrasing",
            "knowledge_passage",
            "knowledge_phrasingvector",
            "knowledge_passagevector",
        ):
            cursor.execute(f"ANALYZE {table}")


# --- query sets ---------------------------------------------------------------------------------


def _fullwidth(text: str) -> str:
    return "".join(
        chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text
    )


# How a user types a stored question differently; each still normalizes to the same key.
TYPING_STYLES = (
    str.lower,
    str.upper,
    _fullwidth,
    lambda s: "  " + s.rstrip("?.").replace(" ", "   ") + " !!",
    lambda s: s.title().rstrip("?") + "??",
)

# Spellings of one query that the (uncased) embedding model and `normalize` treat alike but the
# query-vector LRU, keyed on the raw text, does not: each timed run gets fresh strings.
SPELLINGS = (
    lambda s: s,
    lambda s: s[:1].swapcase() + s[1:],
    str.upper,
    lambda s: s.title() if s.title() != s else s.lower(),
)


def spelled(queries: list[str], variant: int) -> list[str]:
    return [SPELLINGS[variant](q) for q in queries]


def exact_queries(specs: list[FaqSpec], count: int, rng: random.Random) -> list[tuple[str, str]]:
    """(typed query, stored question) for distinct entries: the question or the alias, retyped."""
    out = []
    for index, spec in enumerate(rng.sample(specs, min(count, len(specs)))):
        stored = spec.question if index % 2 == 0 else spec.alias
        for style in TYPING_STYLES[index % len(TYPING_STYLES) :] + TYPING_STYLES:
            typed = style(stored)
            if typed != stored:
                break
        out.append((typed, spec.question))
    return out


def paraphrase_attempts(specs: list[FaqSpec], rng: random.Random) -> list[tuple[str, str]]:
    """(paraphrase, stored question) for every entry, in random order, one paraphrase per entry."""
    return [
        (spec.paraphrases[rng.randrange(2)], spec.question)
        for spec in rng.sample(specs, len(specs))
    ]


@dataclass
class Paraphrases:
    hits: list[str] = field(default_factory=list)  # answered by the vector road
    misses: list[str] = field(default_factory=list)  # not answered
    tried: int = 0
    right: int = 0  # hits that returned the entry the paraphrase was made from
    exact: int = 0  # paraphrases that happen to normalize to a stored phrasing
    reasons: Counter = field(default_factory=Counter)


def paraphrases_classify(
    attempts: list[tuple[str, str]], pk_of: dict[str, int], wanted: int
) -> Paraphrases:
    """Ask each (paraphrase, stored question) until `wanted` hits and misses: the class is what
    happened."""
    out = Paraphrases()
    for text, question in attempts:
        if len(out.hits) >= wanted and len(out.misses) >= wanted:
            break
        out.tried += 1
        result = direct_answer(text)
        if result.hit and result.method == "vector":
            out.hits.append(text)
            out.right += result.entry.pk == pk_of[question]
        elif result.hit:
            out.exact += 1
        else:
            out.misses.append(text)
            # "best score 0.712 is below the threshold 0.80"
            #   -> "best score N is below the threshold N"
            out.reasons[
                re.sub(r"[\d.]+", "N", result.reason.split("(")[0]).replace("KB#N ", "").strip()
            ] += 1
    return out


# Questions no KB entry answers: each template with each of its fillers ("{x}").
OFF_DOMAIN: list[tuple[str, tuple[str, ...]]] = [
    (row["template"], tuple(row["fillers"])) for row in _load("off_domain.json")
]


def off_domain_queries(rng: random.Random) -> list[str]:
    queries = [
        template.replace("{x}", filler) for template, fillers in OFF_DOMAIN for filler in fillers
    ]
    rng.shuffle(queries)
    return queries
