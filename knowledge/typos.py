"""The typo road: a question one or two characters off a curated phrasing ("cancle my order",
"forgot my pasword", "pass word") is that phrasing, answered directly after the exact road and
before the vector one, which embeds a misspelt word as something else.

Precision first, as everywhere in the KB: a wrong direct answer is worse than none. A question
is a typo of a phrasing only when

- their Damerau distance (adjacent transpositions count one) is at most 1, or 2 when the phrasing
  is KB_TYPO_LONG characters or more, and it is the only entry that close;
- they differ only in spacing ("pass word" / "password"), or word for word, each changed word
  keeping its first letter (a typo seldom changes it; a new word often does: lora / qlora), of
  KB_TYPO_MIN_WORD letters or more, without a digit, and not itself a common English word
  (wordfreq's Zipf frequency below KB_TYPO_REAL_WORD): "export" is not a typo of "import", nor
  "off" of "on"; "pasword" is one of "password";
- each changed word is one edit off (two in words of KB_TYPO_LONG_WORD letters or more), where an
  edit drops a letter, adds one, swaps two neighbours, or puts a key next to the right one on a
  QWERTY keyboard in its place: "paypay" is not "paypal" mistyped.

Questions with Chinese or Japanese characters take no typo road: one character off is as often
another word (订单 / 订阅) as a typo, and no word list says which.

PostgreSQL's pg_trgm would find the candidates in the database, but not every PostgreSQL has it
(the embedded one has no contrib extensions). The phrasings are few: each process keeps their
normalized keys and finds the candidates with rapidfuzz in well under a millisecond. The index
follows the KB by a digest of the active FAQ phrasings, read at most every KB_TYPO_INDEX_SECONDS:
a curator's change reaches every process within that time, as a serving-model switch does.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from rapidfuzz import process
from rapidfuzz.distance import OSA

from core import db
from knowledge.normalize import has_cjk

# The active FAQ phrasings the road may answer with, in a stable order.
_PHRASINGS_SQL = """
SELECT p.entry_id, p.normalized
FROM knowledge_phrasing p JOIN knowledge_entry e ON e.id = p.entry_id
WHERE e.active AND e.kind = 'faq' AND p.normalized <> ''
ORDER BY p.id
"""
# Their digest, computed in the database: one short row instead of every phrasing.
_DIGEST_SQL = """
SELECT md5(COALESCE(string_agg(p.entry_id || ':' || p.normalized, E'\\n' ORDER BY p.id), ''))
FROM knowledge_phrasing p JOIN knowledge_entry e ON e.id = p.entry_id
WHERE e.active AND e.kind = 'faq' AND p.normalized <> ''
"""


@dataclass(frozen=True)
class Typo:
    entry_id: int
    phrasing: str  # the phrasing's normalized key
    distance: int


def _digest(rows: list[tuple[int, str]]) -> str:
    text = "\n".join(f"{entry_id}:{key}" for entry_id, key in rows)
    return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - a change detector, not a secret


class TypoIndex:
    """The normalized keys of the active FAQ phrasings, with their entries."""

    def __init__(self, rows: list[tuple[int, str]]):
        self.keys = [key for _, key in rows]
        self.digest = _digest(rows)
        # By length: a key two characters off has a length within two of the question's, so a
        # lookup compares a few lengths' keys, not the whole KB's.
        self._by_length: dict[int, tuple[list[str], list[int]]] = {}
        for entry_id, key in rows:
            keys, entries = self._by_length.setdefault(len(key), ([], []))
            keys.append(key)
            entries.append(entry_id)

    def find(self, key: str) -> Typo | None:
        """The phrasing `key` (a normalized question) is a typo of, under the module's rules."""
        if len(key) < settings.KB_TYPO_MIN_WORD or has_cjk(key):
            return None
        limit = 2 if len(key) >= settings.KB_TYPO_LONG else 1
        found: list[Typo] = []
        for length in range(len(key) - limit, len(key) + limit + 1):
            keys, entries = self._by_length.get(length, ([], []))
            close = process.extract(key, keys, scorer=OSA.distance, score_cutoff=limit, limit=None)
            for phrasing, distance, index in close:
                if distance == 0 or (distance > 1 and len(phrasing) < settings.KB_TYPO_LONG):
                    continue
                if plausible_typo(key, phrasing):
                    found.append(Typo(entries[index], phrasing, int(distance)))
        if len({typo.entry_id for typo in found}) != 1:
            return None  # none, or close to two entries: not a typo the KB can tell
        return min(found, key=lambda typo: typo.distance)


def plausible_typo(question: str, phrasing: str) -> bool:
    """Whether `question` reads as `phrasing` mistyped rather than as other words (both
    normalized, already within the distance)."""
    if question.replace(" ", "") == phrasing.replace(" ", ""):
        return True
    asked, curated = question.split(), phrasing.split()
    if len(asked) != len(curated):
        return False
    from wordfreq import zipf_frequency  # its word lists load on first use (warmed at start)

    edits = 0
    for typed, meant in zip(asked, curated):
        if typed == meant:
            continue
        if (
            typed[0] != meant[0]
            or len(meant) < settings.KB_TYPO_MIN_WORD
            or any(ch.isdigit() for ch in typed + meant)
            or zipf_frequency(typed, "en") >= settings.KB_TYPO_REAL_WORD
        ):
            return False
        # Two edits in one word only in a long one: in a short word, a letter dropped beside one
        # added is another word as often as a typo (paypay / paypal).
        most = 2 if len(meant) >= settings.KB_TYPO_LONG_WORD else 1
        word_edits = keyboard_distance(typed, meant)
        if word_edits > most:
            return False
        edits += word_edits
    return edits <= 2


# Where each letter sits on a QWERTY keyboard: (row, column), each row shifted as keys are.
_KEYS = {
    letter: (row, column + shift)
    for row, (letters, shift) in enumerate(
        (("qwertyuiop", 0.0), ("asdfghjkl", 0.25), ("zxcvbnm", 0.75))
    )
    for column, letter in enumerate(letters)
}


def _next_to(a: str, b: str) -> bool:
    if a not in _KEYS or b not in _KEYS:
        return False
    (row_a, x_a), (row_b, x_b) = _KEYS[a], _KEYS[b]
    return abs(row_a - row_b) <= 1 and abs(x_a - x_b) <= 1.0


def keyboard_distance(typed: str, meant: str) -> int:
    """The edits that make `meant` of `typed`, where a letter may be dropped, added or swapped with
    its neighbour, but replaced only by a key next to it: "paypay" is not "paypal" mistyped (y
    is far from l), "pqypal" is. A large number when no such edits do."""
    far = 99
    rows = [[j for j in range(len(meant) + 1)]]
    for i in range(1, len(typed) + 1):
        row = [i] + [0] * len(meant)
        for j in range(1, len(meant) + 1):
            a, b = typed[i - 1], meant[j - 1]
            replace = 0 if a == b else 1 if _next_to(a, b) else far
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + replace)
            if i > 1 and j > 1 and a == meant[j - 2] and typed[i - 2] == b:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


_index: TypoIndex | None = None
_checked_at = 0.0
_lock = threading.Lock()


def _fresh() -> TypoIndex | None:
    if _index is not None and time.monotonic() - _checked_at < settings.KB_TYPO_INDEX_SECONDS:
        return _index
    return None


def index() -> TypoIndex:
    """This process's index, rebuilt when the active phrasings' digest has changed."""
    global _index, _checked_at
    fresh = _fresh()
    if fresh is not None:
        return fresh
    with _lock:
        if (fresh := _fresh()) is not None:
            return fresh
        with connection.cursor() as cursor:
            cursor.execute(_DIGEST_SQL)
            (digest,) = cursor.fetchone()
            if _index is None or digest != _index.digest:
                cursor.execute(_PHRASINGS_SQL)
                _index = TypoIndex(cursor.fetchall())
        _checked_at = time.monotonic()
        return _index


async def aindex() -> TypoIndex:
    """index() for async callers: no thread hop while the index is fresh."""
    return _fresh() or await db.run(index)  # type: ignore[return-value]  # index() always returns one


def index_forget() -> None:
    """The next lookup reads the KB again (tests, and a curator's change in this process)."""
    global _index, _checked_at
    _index, _checked_at = None, 0.0


def warm() -> int:
    """Build the index and load the word list: the first question must not pay for either."""
    from wordfreq import zipf_frequency

    zipf_frequency("warm", "en")
    return len(index().keys)
