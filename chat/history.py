"""A stored session's earlier turns as a prompt's history: how many of them (cut in steps, so the
prompt's start stays put for several turns and the engine's prefix cache holds it), and each
question replayed with the KB passages it was sent with."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from routing.prompt import History, question_message


def history_start(total: int) -> int:
    """Where a prompt's history starts among a session's `total` earlier messages: all of them up
    to CHAT_HISTORY_TURNS, then from a point that moves in steps of half that many.

    The last CHAT_HISTORY_TURNS alone would move the prompt's start at every turn once the
    conversation is that long, and the engine's prefix cache would hold nothing of the next
    turn but the system prompt. Cut at a multiple of the step, the start stays put while the
    conversation grows by up to a step, the turns meanwhile share their whole prompt start;
    between half and all of CHAT_HISTORY_TURNS are sent (routing.prompt trims for the window
    the same way)."""
    turns = settings.CHAT_HISTORY_TURNS
    if total <= turns:
        return 0
    step = max(1, turns // 2)
    return -(-(total - turns) // step) * step


def history_replay(rows: Iterable[tuple[str, str, str]]) -> History:
    """The earlier turns (role, text, passages), oldest first, as the engine got them: each
    question with the KB passages it was sent with, laid out as routing.prompt lays out a
    question, so a turn's prompt starts byte for byte as the last one did and the engine finds
    it in its prefix cache. A question sent without passages, or stored before they were kept,
    replays as its text. The plain form (the questions as their text) goes along, for a rule
    that does not replay passages."""
    rows = list(rows)
    plain = [{"role": role, "content": text} for role, text, _ in rows]
    return History(
        (
            question_message(message, context or "")
            for message, (_, _, context) in zip(plain, rows, strict=True)
        ),
        plain,
    )


def history_kept(rows: list, total: int) -> list:
    """Of the last CHAT_HISTORY_TURNS of a session's `total` earlier messages (oldest first),
    those from history_start on."""
    return rows[max(0, len(rows) - (total - history_start(total))) :]
