"""Commit subjects of at most 76 characters (zulip's gitlint limit): `git log --oneline` and a
review's list of commits stay readable, and the why goes in the body.

    python -m devtools.commit_subjects                       # the commits after ANCHOR (make lint)
    python -m devtools.commit_subjects --message-file FILE   # a message being written (pre-commit)

The history before ANCHOR has longer subjects and stays as it is. A clone without ANCHOR (a
shallow one) checks the commits made after ANCHOR's date instead.
"""

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 76
# main when the rule came in; every commit after it is checked.
ANCHOR = "01b8bc7adf859eb9952c051df13d49ab61a6626e"
ANCHOR_DATE = "2026-12-06T18:27:03+00:00"
ROOT = Path(__file__).resolve().parent.parent


def too_long(subjects: list[tuple[str, str]]) -> list[str]:
    return [
        f"{where}: {len(subject)} characters: {subject}"
        for where, subject in subjects
        if len(subject) > LIMIT
    ]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args],  # noqa: S607 - the developer's own git, from their PATH
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def history_subjects() -> list[tuple[str, str]] | None:
    """(short id, subject) of every commit after ANCHOR; None outside a git checkout."""
    if _git("rev-parse", "--git-dir").returncode != 0:
        return None
    if _git("cat-file", "-e", f"{ANCHOR}^{{commit}}").returncode == 0:
        log = _git("log", "--format=%h%x00%s", f"{ANCHOR}..HEAD")
    else:
        log = _git("log", "--format=%h%x00%s", f"--since={ANCHOR_DATE}")
    if log.returncode != 0:
        raise SystemExit(f"git log failed: {log.stderr.strip()}")
    return [tuple(line.split("\0", 1)) for line in log.stdout.splitlines() if "\0" in line]


def message_subject(path: Path) -> str:
    """The subject of a message as git will store it: its first line that is not a comment."""
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-file", type=Path, help="check this commit message instead")
    args = parser.parse_args(argv)
    if args.message_file:
        subjects = [("this commit", message_subject(args.message_file))]
    else:
        found = history_subjects()
        if found is None:
            print("commit subjects: not a git checkout, nothing to check")
            return 0
        subjects = found
    problems = too_long(subjects)
    for line in problems:
        print(f"commit subject over {LIMIT} characters, {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
