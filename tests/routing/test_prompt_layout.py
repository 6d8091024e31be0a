"""The prompt's layout, for the engine's prefix cache: what the turns of a conversation and the
requests of a rule share comes first and reads the same, what changes with the question comes
last, and trimming changes the prompt's start only once in a while."""

import itertools

from knowledge.selectors import ContextPassage
from routing.prompt import (
    PASSAGES_PREAMBLE,
    build_messages,
    message_tokens,
    passages_block,
    system_message,
)


def passage(entry_id: int, text: str) -> ContextPassage:
    return ContextPassage(
        entry_id=entry_id, title=f"Entry {entry_id}", kind="faq", text=text, score=0.5
    )


def common_prefix(a: list[dict], b: list[dict]) -> int:
    """How many leading messages two prompts share, word for word."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_system_message_is_the_same_whatever_the_questions_passages():
    system = system_message("Be brief.", with_passages=True)
    assert system == f"Be brief.\n\n{PASSAGES_PREAMBLE}"
    assert system_message("Be brief.", with_passages=False) == "Be brief."
    first, _ = build_messages(
        system=system,
        history=[],
        question={"role": "user", "content": "How do refunds work?"},
        budget=4000,
        passages=passages_block([passage(9, "Refunds take 5 days."), passage(3, "Returns.")]),
    )
    assert first[0] == {"role": "system", "content": system}
    # The passages travel with the question, by entry id whatever their scores.
    assert first[-1]["role"] == "user"
    assert first[-1]["content"].index('id="KB#3"') < first[-1]["content"].index('id="KB#9"')
    assert first[-1]["content"].endswith("\n\nHow do refunds work?")


def test_each_turn_starts_as_the_previous_one_did():
    system = system_message("Be brief.", with_passages=True)
    history: list[dict] = []
    prompts = []
    for turn in range(4):
        question = f"question {turn}"
        messages, dropped = build_messages(
            system=system,
            history=history,
            question={"role": "user", "content": question},
            budget=4000,
            passages=passages_block([passage(turn, f"fact {turn}")]),
        )
        assert dropped == 0
        prompts.append(messages)
        history += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"answer {turn}"},
        ]
    for before, after in itertools.pairwise(prompts):
        # Everything but the previous question (sent with its passages) is shared.
        assert common_prefix(before, after) == len(before) - 1


def test_over_the_window_history_is_cut_to_half_its_room_so_the_next_turns_keep_the_prefix():
    turn_cost = message_tokens({"content": "question 00 " + "blah " * 10}) * 2
    budget = 20 * turn_cost
    history: list[dict] = []
    firsts, drops = [], []
    for turn in range(40):
        messages, dropped = build_messages(
            system="Be brief.",
            history=history,
            question={"role": "user", "content": f"question {turn:02d}"},
            budget=budget,
        )
        assert sum(message_tokens(m) for m in messages) <= budget
        firsts.append(messages[1]["content"] if len(messages) > 2 else None)
        drops.append(dropped)
        history += [
            {"role": "user", "content": f"question {turn:02d} " + "blah " * 10},
            {"role": "assistant", "content": f"answer {turn:02d} " + "blah " * 10},
        ]
    # The prompt's start (its first history message) changes only when a cut happens, and a cut
    # leaves room for several turns before the next one.
    changes = sum(1 for a, b in itertools.pairwise(firsts) if a != b and a is not None)
    cuts = sum(1 for a, b in itertools.pairwise(drops) if b > a)
    assert changes == cuts
    assert 2 <= cuts <= 40 // 5, (cuts, drops)


def replayed_conversation(turns: int, *, filler: int = 0) -> tuple[str, list[list[dict]]]:
    """`turns` turns of a stored conversation, each question sent with its passages and the
    history replayed as chat.history.history_replay does; the system message and each prompt."""
    from chat.history import history_replay

    system = system_message("Be brief.", with_passages=True)
    rows: list[tuple[str, str, str]] = []
    prompts = []
    for turn in range(turns):
        question = f"question {turn:02d} " + "blah " * filler
        passages = passages_block([passage(turn, f"fact {turn} " + "blah " * filler)])
        messages, _ = build_messages(
            system=system,
            history=history_replay(rows),
            question={"role": "user", "content": question},
            budget=20 * message_tokens({"content": "blah " * (3 * filler + 10)}),
            passages=passages,
        )
        prompts.append(messages)
        rows += [("user", question, passages), ("assistant", f"answer {turn:02d}", "")]
    return system, prompts


def test_a_replayed_conversation_starts_each_turn_with_the_whole_previous_prompt():
    _, prompts = replayed_conversation(4)
    for before, after in itertools.pairwise(prompts):
        assert after[: len(before)] == before
        assert [m["role"] for m in after[len(before) :]] == ["assistant", "user"]


def test_trimming_a_replayed_conversation_drops_whole_turns_with_their_passages():
    _system, prompts = replayed_conversation(40, filler=10)
    cut = [p for p in prompts if "question 00" not in p[1]["content"]]
    assert cut, "the conversation never outgrew its window"
    for messages in cut:
        history = messages[1:-1]
        # It starts at a question, which keeps its passages, and goes on turn by turn.
        assert history[0]["role"] == "user"
        assert history[0]["content"].startswith('<passage id="KB#')
        assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2)
        number = history[0]["content"].split("question ")[1][:2]
        assert f'id="KB#{int(number)}"' in history[0]["content"]


def test_a_rule_that_does_not_replay_passages_sends_earlier_questions_as_their_text():
    from chat.history import history_replay

    system = system_message("Be brief.", with_passages=True)
    first = passages_block([passage(1, "Refunds take 5 days.")])
    history = history_replay([("user", "question 0", first), ("assistant", "answer 0", "")])
    question = {"role": "user", "content": "question 1"}
    now = passages_block([passage(2, "Shipping takes 2 days.")])

    replayed, _ = build_messages(
        system=system, history=history, question=question, budget=4000, passages=now
    )
    plain, _ = build_messages(
        system=system, history=history, question=question, budget=4000, passages=now, replay=False
    )

    assert replayed[1] == {"role": "user", "content": f"{first}\n\nquestion 0"}
    assert plain[1] == {"role": "user", "content": "question 0"}
    # Only the earlier question differs: this question still goes with its passages.
    assert plain[0] == replayed[0] and plain[2:] == replayed[2:]
    assert plain[-1]["content"] == f"{now}\n\nquestion 1"


def test_a_clients_own_history_goes_as_sent_whatever_the_rule_replays():
    # /v1 sends its history itself: no plain form to fall back on, nothing taken out.
    history = [
        {"role": "user", "content": "<passage>my own notes</passage> question 0"},
        {"role": "assistant", "content": "answer 0"},
    ]
    question = {"role": "user", "content": "question 1"}
    for replay in (True, False):
        messages, _ = build_messages(
            system="", history=history, question=question, budget=4000, replay=replay
        )
        assert messages == [*history, question]


def test_the_plain_history_is_cut_at_a_user_turn_like_the_replayed_one():
    from chat.history import history_replay

    rows = []
    for turn in range(30):
        block = passages_block([passage(turn, f"fact {turn} " + "blah " * 30)])
        rows += [("user", f"question {turn:02d}", block), ("assistant", f"answer {turn:02d}", "")]
    history = history_replay(rows)
    question = {"role": "user", "content": "question 30"}
    budget = 20 * message_tokens({"content": "blah " * 40})
    for replay in (True, False):
        messages, dropped = build_messages(
            system="Be brief.", history=history, question=question, budget=budget, replay=replay
        )
        assert sum(map(message_tokens, messages)) <= budget
        assert messages[1]["role"] == "user"
        assert messages[1]["content"].endswith(f"question {dropped // 2:02d}")
    # The plain questions are shorter: more of the conversation fits.
    kept = {
        replay: len(
            build_messages(
                system="Be brief.", history=history, question=question, budget=budget, replay=replay
            )[0]
        )
        for replay in (True, False)
    }
    assert kept[False] > kept[True]
