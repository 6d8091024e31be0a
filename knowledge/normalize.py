"""Text folding for exact matching: the same question typed differently is the same key.

NFKC folds full-width Latin and digits to half-width (ＬｏＲＡ → LoRA, ？ → ?);
casefold handles case; punctuation and symbols are dropped; whitespace collapses,
and disappears next to CJK characters, which are written without spaces.
"""

import re
import unicodedata

from core.text import CJK_RANGES

_CJK = CJK_RANGES
_SPACE_NEAR_CJK = re.compile(rf"(?<=[{_CJK}]) | (?=[{_CJK}])")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    kept = [" " if unicodedata.category(ch)[0] in "PSZC" else ch for ch in text]
    text = _SPACES.sub(" ", "".join(kept)).strip()
    return _SPACE_NEAR_CJK.sub("", text)


_CJK_RUN = re.compile(rf"[{_CJK}]+")


def has_cjk(text: str) -> bool:
    return _CJK_RUN.search(text) is not None


def lexical_terms(text: str) -> set[str]:
    """Words of Latin-script text and character bigrams of CJK text (which has no spaces)."""
    key = normalize(text)
    terms: set[str] = set()
    for run in _CJK_RUN.findall(key):
        terms.update(run[i : i + 2] for i in range(max(1, len(run) - 1)))
    terms.update(_CJK_RUN.sub(" ", key).split())
    return terms


def lexical_similarity(a: str, b: str) -> float:
    """Dice coefficient of the lexical terms of two texts, 0..1."""
    ta, tb = lexical_terms(a), lexical_terms(b)
    if not ta or not tb:
        return 0.0
    return 2 * len(ta & tb) / (len(ta) + len(tb))
