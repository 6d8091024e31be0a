"""A module's syntax tree, for the tests that read the source (layers, imports).

CPython 3.11 keeps the AST constructor's recursion count per interpreter, not per thread: an
`ast.parse` in another thread at the same moment (3.11's traceback module parses the failing line
to draw its carets, so any logged exception does) can fail this one with a spurious
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). The parse itself
is deterministic, so it is done again."""

import ast
from pathlib import Path

_TRIES = 5


def parse(path: Path) -> ast.Module:
    source = path.read_text()
    for _ in range(_TRIES - 1):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError:
            continue
    return ast.parse(source, filename=str(path))
