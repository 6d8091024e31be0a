"""A string that a regular expression matches: what the simulated model writes under
`structured_outputs.regex`, and for a JSON schema string with a `pattern`.

The pattern is parsed with Python's own regex parser and walked once, taking the first
alternative, the first character of a class and the fewest repeats that still give some text.
Lookarounds are ignored (no constrained decoder supports them either).
"""

import re
from re import _constants as c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

_CATEGORY_CHARS = {
    c.CATEGORY_DIGIT: "0",
    c.CATEGORY_NOT_DIGIT: "a",
    c.CATEGORY_WORD: "a",
    c.CATEGORY_NOT_WORD: " ",
    c.CATEGORY_SPACE: " ",
    c.CATEGORY_NOT_SPACE: "a",
}
_CATEGORY_PATTERNS = {
    c.CATEGORY_DIGIT: r"\d",
    c.CATEGORY_NOT_DIGIT: r"\D",
    c.CATEGORY_WORD: r"\w",
    c.CATEGORY_NOT_WORD: r"\W",
    c.CATEGORY_SPACE: r"\s",
    c.CATEGORY_NOT_SPACE: r"\S",
}
# Tried in order for a negated class or NOT_LITERAL: the first one the class does not exclude.
_CANDIDATES = "a0A _-.x"


def sample(pattern: str) -> str:
    """A string matching `pattern`; ValueError when it is not a valid regex."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise ValueError(str(exc)) from None
    groups: dict[int, str] = {}
    return _walk(parsed, groups)


def _walk(items, groups: dict[int, str]) -> str:
    out: list[str] = []
    for op, arg in items:
        if op is c.LITERAL:
            out.append(chr(arg))
        elif op is c.NOT_LITERAL:
            out.append(next(ch for ch in _CANDIDATES if ord(ch) != arg))
        elif op is c.ANY:
            out.append("a")
        elif op is c.IN:
            out.append(_in_class(arg))
        elif op is c.CATEGORY:
            out.append(_CATEGORY_CHARS.get(arg, "a"))
        elif op is c.BRANCH:
            out.append(_walk(arg[1][0], groups))
        elif op is c.SUBPATTERN:
            group, _add, _del, sub = arg
            text = _walk(sub, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            low, high, sub = arg
            count = max(low, min(high, 1))
            out.append("".join(_walk(sub, groups) for _ in range(count)))
        elif op is c.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op is getattr(c, "ATOMIC_GROUP", None):
            out.append(_walk(arg, groups))
        # AT (anchors), ASSERT, ASSERT_NOT: match no text.
    return "".join(out)


def _in_class(items) -> str:
    negated = bool(items) and items[0][0] is c.NEGATE
    if not negated:
        op, arg = items[0]
        if op is c.LITERAL:
            return chr(arg)
        if op is c.RANGE:
            return chr(arg[0])
        if op is c.CATEGORY:
            return _CATEGORY_CHARS.get(arg, "a")
        return "a"
    excluded = items[1:]
    for ch in _CANDIDATES:
        if not any(_class_item_matches(op, arg, ch) for op, arg in excluded):
            return ch
    return "~"


def _class_item_matches(op, arg, ch: str) -> bool:
    code = ord(ch)
    if op is c.LITERAL:
        return code == arg
    if op is c.RANGE:
        return arg[0] <= code <= arg[1]
    if op is c.CATEGORY:
        return bool(re.match(_CATEGORY_PATTERNS.get(arg, r"\w"), ch))
    return False
