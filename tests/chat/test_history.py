"""A stored conversation's history as a turn's start reads it. Cut in steps: past
CHAT_HISTORY_TURNS messages the prompt's start stays at one message for several turns, so the
engine's prefix cache keeps serving the conversation, where the last N messages alone would move
the start at every turn. Replayed with each question's passages, its plain form alongside for a
rule that does not replay them. Turns started and finished through the services, on the real
database."""

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from chat import services, versions
from chat.history import history_start
from chat.models import ChatSession, Message
from routing.prompt import History, build_messages

pytestmark = pytest.mark.django_db


def converse(user, turns: int) -> tuple[int, list[list[dict]]]:
    """`turns` questions asked and answered in one new session; the history each turn's start
    read."""
    session = ChatSession.objects.create(user=user, title="long")
    histories = []
    for turn in range(turns):
        start = async_to_sync(services.aturn_start)(
            user=user, session_id=session.pk, content=f"question {turn}"
        )
        histories.append(start.history)
        async_to_sync(services.aturn_finish)(
            message_id=start.assistant_id,
            status=Message.Status.COMPLETE,
            content=f"answer {turn}",
        )
    return session.pk, histories


@override_settings(CHAT_HISTORY_TURNS=8)
def test_over_twice_the_limit_the_first_kept_turn_changes_only_at_the_steps(alice):
    _, histories = converse(alice, 16)

    firsts = [history[0]["content"] if history else None for history in histories]
    # Up to 8 earlier messages (4 exchanges) all of them; then the start moves by a step of 4
    # messages, two turns apart, each time to a question.
    assert firsts == [None] + ["question 0"] * 4 + [
        f"question {first}" for first in (2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12)
    ]
    for turn, history in enumerate(histories):
        assert len(history) <= 8
        assert len(history) >= min(2 * turn, 5)
        # The history ends with the turn before this one, whatever was cut at its start.
        if turn:
            assert history[-2:] == [
                {"role": "user", "content": f"question {turn - 1}"},
                {"role": "assistant", "content": f"answer {turn - 1}"},
            ]


@override_settings(CHAT_HISTORY_TURNS=8)
def test_a_regenerated_answer_reads_the_history_its_turn_read(alice):
    _, histories = converse(alice, 11)
    last = Message.objects.filter(role="assistant").order_by("-created_at", "-pk").first()

    redo = versions.turn_redo_start(user=alice, message_id=last.pk, content=None)

    assert redo.history == histories[-1]
    assert redo.history[0]["content"] == "question 6"


@override_settings(CHAT_HISTORY_TURNS=0)
def test_no_history_is_sent_when_the_limit_is_zero(alice):
    _, histories = converse(alice, 3)
    assert histories == [[], [], []]


def test_the_cut_falls_at_multiples_of_half_the_limit(settings):
    settings.CHAT_HISTORY_TURNS = 20
    starts = [history_start(total) for total in range(0, 61)]
    assert starts[:21] == [0] * 21
    assert starts[21:31] == [10] * 10
    assert starts[31:41] == [20] * 10
    assert starts[60] == 40
    # Never more than the limit, never fewer than half of it.
    assert all(10 < total - start <= 20 for total, start in enumerate(starts) if total > 20)
    settings.CHAT_HISTORY_TURNS = 1
    assert [history_start(total) for total in range(4)] == [0, 0, 1, 2]


def test_the_history_carries_each_question_with_its_passages_and_as_its_text(alice):
    session = ChatSession.objects.create(user=alice, title="replayed")
    Message.objects.create(
        session=session, role="user", content="Refunds?", context='<passage id="KB#1">…'
    )
    Message.objects.create(session=session, role="assistant", content="Within 30 days.")

    start = async_to_sync(services.aturn_start)(
        user=alice, session_id=session.pk, content="And the shipping?"
    )

    assert isinstance(start.history, History)
    assert start.history[0] == {"role": "user", "content": '<passage id="KB#1">…\n\nRefunds?'}
    assert start.history.plain[0] == {"role": "user", "content": "Refunds?"}
    assert start.history[1] == start.history.plain[1]
    # What each kind of rule sends.
    question = {"role": "user", "content": "And the shipping?"}
    replayed, _ = build_messages(system="", history=start.history, question=question, budget=900)
    plain, _ = build_messages(
        system="", history=start.history, question=question, budget=900, replay=False
    )
    assert replayed == [*start.history, question]
    assert plain == [*start.history.plain, question]
