"""A labelled set's file: one JSON object a line (UTF-8, Chinese as it is), written by its
generator and read by its benchmark and its tests."""

from __future__ import annotations

import json
from pathlib import Path


def rows_write(path: Path, rows: list[dict]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8"
    )
    return len(rows)


def rows_read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
