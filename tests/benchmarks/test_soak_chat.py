"""`manage.py soak_chat`: many sockets asking in turn for a while against its own stack, every
answer checked against what the engine sent (echo: the question) and what the gateway stored.
A short soak here (docs/benchmarks.md#fig-soak is the long one); in a subprocess, because the
command points its database connection at its own database."""

import io
from typing import ClassVar

import pytest

from benchmarks import chat_ws
from benchmarks.management.commands.soak_chat import Command
from tests.support.commands import manage


@pytest.mark.processes
def test_a_short_soak_loses_reorders_and_misstores_nothing(child_env):
    stdout = manage(child_env, "soak_chat", "--sockets", "24", "--seconds", "6", timeout=240)
    lines = stdout.splitlines()
    answers = next(line for line in lines if line.startswith("answers: "))
    assert int(answers.split()[1]) >= 24  # every socket answered at least once
    assert "errors: 0" in lines
    assert (
        "answers that differ from what the engine sent (lost, reordered or duplicated tokens): 0"
        in lines
    )
    assert "answers stored differently from what the socket showed: 0" in lines
    assert any(line.startswith("gateway memory (RSS): ") for line in lines)


@pytest.mark.django_db
def test_the_check_counts_a_lost_or_reordered_token_and_a_misstored_answer(django_user_model):
    from chat.models import ChatSession, Message

    user = django_user_model.objects.create_user("soaker")
    session = ChatSession.objects.create(user=user, title="soak")
    Message.objects.create(session=session, role=Message.Role.ASSISTANT, content="a b c")
    Message.objects.create(
        session=session, role=Message.Role.ASSISTANT, content="a c"
    )  # stored short

    def answer(index, parts, asked):
        return chat_ws.Answer(
            socket=0,
            index=index,
            end=1.0,
            ttft=0.1,
            tokens=3,
            asked=asked,
            parts=parts,
            session=session.pk,
        )

    level = chat_ws.Level(
        sockets=1,
        makespan=2.0,
        answers=[
            answer(0, ["a", " b", " c"], "a b c"),  # right, stored right
            answer(
                1, ["a", " c", " b"], "a b c"
            ),  # reordered, and stored differently from what was shown
        ],
    )
    command = Command(stdout=io.StringIO())
    assert command.report(level, memory=_NoMemory(), before=None) == 2
    out = command.stdout.getvalue()
    assert "(lost, reordered or duplicated tokens): 1" in out
    assert "answers stored differently from what the socket showed: 1" in out


class _NoMemory:
    samples: ClassVar[list] = []
