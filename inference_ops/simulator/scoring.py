"""/rerank and /score for a simulated cross-encoder (vLLM serves them for reranker models).

A real cross-encoder reads the query and the document together and outputs one logit, which
vLLM passes through a sigmoid: a relevance between 0 and 1. The simulator's stand-in reads both
texts too, and only their words: the overlap (Dice) of their word and CJK-bigram features, each
weighted by its length so that "subscription" counts for more than "how do I", squashed by a
logistic around MIDPOINT. Deterministic, and two texts that share their long words score high,
which is enough to exercise a second stage end to end. Not a language model: a paraphrase with
none of the same words scores low.

For an embedding model (--embedding-dim) vLLM scores a pair by the cosine of the two embeddings
(`_embedding_score`); so does the simulator, with its own vectors.
"""

import math
import re

from . import embeddings as sim_embeddings

# A run of CJK characters (written without spaces), or a word of any other script.
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff"
_PIECE = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+", re.UNICODE)
_CJK_RUN = re.compile(rf"[{_CJK}]+")
MIDPOINT = 0.7  # the overlap that scores 0.5
STEEPNESS = 12.0
# The tokens a pair costs beyond its two texts: `<s> query </s></s> document </s>`, the pair
# template of XLM-RoBERTa rerankers such as bge-reranker-v2-m3.
PAIR_SPECIAL_TOKENS = 4


def features(text: str) -> dict[str, int]:
    """Each word, or each bigram of a CJK run (the character itself when alone), and its weight."""
    found: dict[str, int] = {}
    for piece in _PIECE.findall(text.casefold()):
        if _CJK_RUN.fullmatch(piece):
            grams = (
                [piece] if len(piece) == 1 else [piece[i : i + 2] for i in range(len(piece) - 1)]
            )
        else:
            grams = [piece]
        for gram in grams:
            found[gram] = len(gram)
    return found


def overlap(query: str, document: str) -> float:
    """Weighted Dice coefficient of the two texts' features: 1.0 for the same words, 0.0 for
    none."""
    one, two = features(query), features(document)
    total = sum(one.values()) + sum(two.values())
    if not total:
        return 0.0
    shared = sum(weight for gram, weight in one.items() if gram in two)
    return 2 * shared / total


def cross_encoder_score(query: str, document: str) -> float:
    return 1.0 / (1.0 + math.exp(-STEEPNESS * (overlap(query, document) - MIDPOINT)))


def embedding_score(query: str, document: str, dim: int) -> float:
    one, two = sim_embeddings.embed(query, dim), sim_embeddings.embed(document, dim)
    return sum(a * b for a, b in zip(one, two))
