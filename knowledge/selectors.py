"""Reads from the knowledge base: direct answers, matches, and context for generation."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from core import db, rawsql
from knowledge import typos
from knowledge.embedding import aembed_query, embed_query, spec_of, vector_literal
from knowledge.guards import follow_up_marker
from knowledge.models import EmbeddingModel, Entry, Passage, PassageVector
from knowledge.normalize import normalize
from knowledge.rerank import arerank_verdict, rerank_verdict
from knowledge.verdict import DirectAnswer, Match, vector_verdict

# How long a process trusts its idea of the serving model. A model switch reaches
# every process within this time; until then the old vectors (still present) serve.
_SERVING_TTL = 10.0
_serving: tuple[float, EmbeddingModel | None] = (0.0, None)


def serving_model() -> EmbeddingModel | None:
    global _serving
    checked_at, model = _serving
    if time.monotonic() - checked_at > _SERVING_TTL or model is None:
        model = EmbeddingModel.objects.filter(state=EmbeddingModel.State.SERVING).first()
        _serving = (time.monotonic(), model)
    return model


async def aserving_model() -> EmbeddingModel | None:
    """serving_model for async callers: no thread hop while the cached answer is fresh."""
    checked_at, model = _serving
    if model is not None and time.monotonic() - checked_at <= _SERVING_TTL:
        return model
    return await db.run(serving_model)


def serving_model_forget() -> None:
    global _serving
    _serving = (0.0, None)


@dataclass
class ContextPassage:
    entry_id: int
    title: str
    kind: str
    text: str
    score: float

    @property
    def label(self) -> str:
        return f"KB#{self.entry_id}: {self.title[:80]}"


def _nearest(
    table: str, owner: str, model: EmbeddingModel, vector, limit: int
) -> list[tuple[int, float]]:
    """(owner id, cosine similarity) of the nearest vectors of `model`, through its HNSW index."""
    dims = int(model.dimensions)
    # The model id and dimensions are integers from our own rows; inlining them lets the
    # planner match the partial index (`WHERE model_id = N`, `embedding::vector(dims)`).
    sql = (
        f"SELECT {owner}_id, 1 - ((embedding::vector({dims})) <=> %s::vector({dims})) AS score "  # noqa: S608 - _meta's names; values are parameters
        f"FROM {table} WHERE model_id = {int(model.pk)} "
        f"ORDER BY (embedding::vector({dims})) <=> %s::vector({dims}) LIMIT %s"
    )
    literal = vector_literal(vector)
    with connection.cursor() as cursor:
        cursor.execute(sql, [literal, literal, limit])
        return cursor.fetchall()


# The vector road in one statement: the HNSW index's 40 nearest phrasings, the best phrasing of
# each active FAQ entry among them, the entry's columns, and every phrasing of the entry for the
# lexical check. One round trip instead of three; the ORM would add a query per relation.
_FAQ_MATCHES_SQL = """
WITH nearest AS (
    SELECT phrasing_id, (embedding::vector({dims})) <=> %(vector)s::vector({dims}) AS distance
    FROM knowledge_phrasingvector WHERE model_id = {model_id}
    ORDER BY distance LIMIT {candidates}
), best AS (
    SELECT DISTINCT ON (p.entry_id) p.entry_id, p.text, n.distance
    FROM nearest n JOIN knowledge_phrasing p ON p.id = n.phrasing_id
    ORDER BY p.entry_id, n.distance
)
SELECT {entry_columns}, best.text, 1 - best.distance,
       ARRAY(SELECT q.text FROM knowledge_phrasing q WHERE q.entry_id = e.id ORDER BY q.id)
FROM best JOIN knowledge_entry e ON e.id = best.entry_id
WHERE e.active AND e.kind = 'faq'
ORDER BY best.distance, e.id
LIMIT %(limit)s
"""
_CANDIDATES = 40


def faq_matches(
    text: str,
    *,
    limit: int = 5,
    model: EmbeddingModel | None = None,
    vector: tuple[float, ...] | None = None,
) -> list[Match]:
    """The nearest active FAQ entries by vector, best phrasing per entry, best first.

    Each match carries all phrasings of its entry, so the verdict's lexical check needs no query.
    """
    model = model or serving_model()
    if model is None:
        return []
    if vector is None:
        vector = embed_query(spec_of(model), text)
    sql, params = _faq_statement(model, vector, limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return _matches(cursor.fetchall())


def _faq_statement(model: EmbeddingModel, vector, limit: int) -> tuple[str, dict]:
    # The model id and dimensions are integers from our own rows; inlining them lets the
    # planner match the partial index (`WHERE model_id = N`, `embedding::vector(dims)`).
    sql = _FAQ_MATCHES_SQL.format(
        dims=int(model.dimensions),
        model_id=int(model.pk),
        candidates=_CANDIDATES,
        entry_columns=rawsql.columns(Entry, "e"),
    )
    return sql, {"vector": vector_literal(vector), "limit": limit}


def _matches(rows) -> list[Match]:
    width = rawsql.width(Entry)
    return [
        Match(
            entry=rawsql.instance(Entry, row),
            phrasing=row[width],
            score=float(row[width + 1]),
            texts=tuple(row[width + 2]),
        )
        for row in rows
    ]


_EXACT_SQL = """
SELECT {entry_columns}, p."primary"
FROM knowledge_phrasing p JOIN knowledge_entry e ON e.id = p.entry_id
WHERE p.normalized = %s AND e.active AND e.kind = 'faq'
ORDER BY e.id LIMIT 1
"""


@functools.cache
def _with_entry(template: str) -> str:
    """`template` with the entry's columns in place, once per process: the statements of every
    question are the same text."""
    return template.format(entry_columns=rawsql.columns(Entry, "e"))


def exact_match(key: str) -> DirectAnswer | None:
    """The FAQ entry one of whose phrasings is `key` (already normalized), as a direct answer."""
    with connection.cursor() as cursor:
        cursor.execute(_with_entry(_EXACT_SQL), [key])
        return _exact_answer(cursor.fetchone())


def _exact_answer(row) -> DirectAnswer | None:
    if row is None:
        return None
    return DirectAnswer(
        hit=True,
        method="exact",
        entry=rawsql.instance(Entry, row),
        score=1.0,
        reason=f"exact match on {'the question' if row[-1] else 'an alias'} (normalized)",
    )


_ENTRY_SQL = """
SELECT {entry_columns} FROM knowledge_entry e WHERE e.id = %s AND e.active AND e.kind = 'faq'
"""


def _typo_answer(typo: typos.Typo | None, row) -> DirectAnswer | None:
    """The entry `typo` points at (`row`: read now, so its answer is the current one)."""
    if typo is None or row is None:
        return None
    off = "one character" if typo.distance == 1 else f"{typo.distance} characters"
    return DirectAnswer(
        hit=True,
        method="typo",
        entry=rawsql.instance(Entry, row),
        score=1.0,
        reason=f"{off} off the phrasing {typo.phrasing!r} (normalized)",
    )


def typo_match(key: str) -> DirectAnswer | None:
    """The FAQ entry one of whose phrasings `key` (normalized) is a typo of (knowledge.typos)."""
    if not settings.KB_TYPO_ROAD:
        return None
    typo = typos.index().find(key)
    if typo is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_with_entry(_ENTRY_SQL), [typo.entry_id])
        return _typo_answer(typo, cursor.fetchone())


async def _atypo_match(key: str) -> DirectAnswer | None:
    if not settings.KB_TYPO_ROAD:
        return None
    typo = (await typos.aindex()).find(key)
    if typo is None:
        return None
    row = await db.query_one(_with_entry(_ENTRY_SQL), [typo.entry_id])
    return _typo_answer(typo, row)


def direct_answer(text: str, *, with_matches: bool = False) -> DirectAnswer:
    """Can the KB answer `text` by itself? Exact match first, then a typo of a phrasing, then a
    guarded vector match."""
    key = normalize(text)
    if not key:
        return DirectAnswer(hit=False, method="none", reason="the question is empty")
    exact = exact_match(key) or typo_match(key)
    if exact is not None and not with_matches:
        return exact
    model = serving_model()
    matches = faq_matches(text, limit=5, model=model)
    if exact is not None:
        exact.matches = matches
        return exact
    if model is None:
        return DirectAnswer(hit=False, method="none", reason="no embedding model serves yet")
    return rerank_verdict(
        text, matches, vector_verdict(text, matches, threshold=model.threshold, margin=model.margin)
    )


def context_passages(
    text: str,
    *,
    k: int | None = None,
    min_score: float | None = None,
    vector: tuple[float, ...] | None = None,
    model: EmbeddingModel | None = None,
) -> list[ContextPassage]:
    """Top-k passages of active entries of any kind, for the prompt, each with a citation label.
    `vector`, when given, is the question's embedding by `model` (default: the serving model)."""
    k = k or settings.KB_CONTEXT_K
    model = model or serving_model()
    if model is None or not normalize(text):
        return []
    min_score = model.context_min if min_score is None else min_score
    if vector is None:
        vector = embed_query(spec_of(model), text)
    sql, params = _context_statement(model, vector, k=k, min_score=min_score)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return _passages(cursor.fetchall())


def _context_statement(
    model: EmbeddingModel, vector, *, k: int, min_score: float
) -> tuple[str, dict]:
    """One statement: the nearest passages through the HNSW index, joined to their text and
    entry, the inactive and the weak left out, the best k in order."""
    dims = int(model.dimensions)
    sql = (
        "WITH nearest AS ("  # noqa: S608 - _meta's names; values are parameters
        " SELECT passage_id,"
        f" 1 - ((embedding::vector({dims})) <=> %(vector)s::vector({dims})) AS score"
        f" FROM {PassageVector._meta.db_table} WHERE model_id = {int(model.pk)}"
        f" ORDER BY (embedding::vector({dims})) <=> %(vector)s::vector({dims}) LIMIT %(limit)s)"
        " SELECT p.entry_id, e.question, e.kind, p.text, n.score"
        f" FROM nearest n JOIN {Passage._meta.db_table} p ON p.id = n.passage_id"
        f" JOIN {Entry._meta.db_table} e ON e.id = p.entry_id"
        " WHERE e.active AND n.score >= %(min_score)s ORDER BY n.score DESC, p.id LIMIT %(k)s"
    )
    return sql, {
        "vector": vector_literal(vector),
        "limit": max(k * 4, 20),
        "min_score": min_score,
        "k": k,
    }


def _passages(rows) -> list[ContextPassage]:
    return [
        ContextPassage(entry_id=entry_id, title=title, kind=kind, text=text, score=float(score))
        for entry_id, title, kind, text, score in rows
    ]


def warm_statements() -> list[tuple[str, list | dict]]:
    """The KB's hot statements with inputs that match nothing, for the warm-up (see
    chat.services.warm_statements): the exact match, the typo road's entry, and with a serving
    model the vector match and the context retrieval."""
    statements: list[tuple[str, list | dict]] = [
        (_with_entry(_EXACT_SQL), [""]),
        (_with_entry(_ENTRY_SQL), [0]),
    ]
    model = serving_model()
    if model is not None:
        zero = (0.0,) * int(model.dimensions)
        statements += [
            _faq_statement(model, zero, 1),
            _context_statement(model, zero, k=1, min_score=2.0),
        ]
    return statements


async def adirect_answer(text: str, *, in_conversation: bool = False) -> DirectAnswer:
    """direct_answer for async callers. The query embedding runs micro-batched in a worker
    thread; the two statements (exact, then vector) go through core.db.query_one / query_all.
    `in_conversation`: the question follows earlier messages, so a follow-up (knowledge.guards)
    is not answered directly, however well it matches; the verdict keeps its vector for the rest."""
    verdict = await _adirect_answer(text)
    if in_conversation and verdict.hit and (marker := follow_up_marker(text)):
        verdict.hit, verdict.method = False, "follow_up"
        verdict.reason = (
            f"a follow-up to the conversation ({marker!r}): KB#{verdict.entry.pk} is not answered "  # type: ignore[union-attr]  # a hit has its entry
            "on its own"
        )
    return verdict


async def _adirect_answer(text: str) -> DirectAnswer:
    key = normalize(text)
    if not key:
        return DirectAnswer(hit=False, method="none", reason="the question is empty")
    exact = _exact_answer(await db.query_one(_with_entry(_EXACT_SQL), [key])) or await _atypo_match(
        key
    )
    if exact is not None:
        return exact
    model = await aserving_model()
    if model is None:
        return DirectAnswer(hit=False, method="none", reason="no embedding model serves yet")
    vector = await aembed_query(spec_of(model), text)
    matches = _matches(await db.query_all(*_faq_statement(model, vector, 5)))
    # No I/O: the matches carry what the verdict reads.
    verdict = vector_verdict(text, matches, threshold=model.threshold, margin=model.margin)
    verdict.vector, verdict.model = vector, model
    return await arerank_verdict(text, matches, verdict)


async def aquery_vector(text: str) -> tuple[EmbeddingModel, tuple[float, ...]] | None:
    """The serving model and the question's vector by it, or None when no model serves."""
    model = await aserving_model()
    if model is None or not normalize(text):
        return None
    return model, await aembed_query(spec_of(model), text)


async def acontext_passages(
    text: str,
    *,
    k: int | None = None,
    query: tuple[EmbeddingModel, tuple[float, ...]] | None = None,
) -> list[ContextPassage]:
    """context_passages for async callers; `query` is the (model, vector) the request already
    has."""
    query = query or await aquery_vector(text)
    if query is None:
        return []
    model, vector = query
    if not normalize(text):
        return []
    statement = _context_statement(
        model, vector, k=k or settings.KB_CONTEXT_K, min_score=model.context_min
    )
    return _passages(await db.query_all(*statement))
