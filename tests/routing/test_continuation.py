"""An answer whose stream breaks after its first tokens is finished, not lost: the text so far goes
as an assistant prefill to the same target or the next, and the new tokens follow the old in the
same stream. Where nothing can continue it, the original failure ends it as a partial answer."""

import pytest

from tests.inference_ops.simulator_process import start_simulator
from tests.support.answers import answer_text, ask, kinds
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db

QUESTION = "Tell me about the old lighthouses of Brittany and their keepers"
LONG = 200  # more than the echo needs: every answer ends by itself


@pytest.fixture
def echo_sim():
    """An echo simulator of this test's own (faults with `times=N` count per process)."""
    sim = start_simulator(
        "serve", "acme/local", "--mode", "echo", "--time-to-first-token", "5",
        "--inter-token-latency", "5",
    )  # fmt: skip
    yield sim
    sim.stop()


def _whole(name: str) -> str:
    """The answer an unbroken stream gives, asked of the endpoint `name` by name (the echo
    simulator answers a prompt the same every time, to its end: no token ceiling reached)."""
    events = ask(QUESTION, model=name, max_tokens=LONG)
    assert events[-1].type == "done" and events[-1].finish_reason == "stop"
    return answer_text(events)


def test_a_stream_cut_once_is_continued_on_the_same_target_with_nothing_lost(echo_sim):
    cut = endpoint("cut", echo_sim, extra_headers={"X-Sim-Fail": "mid-stream;after=3;times=1"})
    whole = endpoint("whole", echo_sim)
    rule("default", cut, whole, is_default=True, use_kb_context=False)
    expected = _whole("whole")
    events = ask(QUESTION, max_tokens=LONG)
    routes = [e for e in events if e.type == "route"]
    assert [r.target for r in routes] == ["cut", "cut"] and routes[1].continued_from == "cut"
    assert "continued by the same model" in routes[1].reason
    done = events[-1]
    assert done.type == "done" and done.continued == ("cut",) and done.target == "cut"
    assert answer_text(events) == expected  # no token repeated or lost
    # Both attempts count: the continuation's prompt holds the prefill, the completions add up.
    assert (
        done.usage["total_tokens"] == done.usage["prompt_tokens"] + done.usage["completion_tokens"]
    )
    # The cut attempt read the prompt; the continuation the prompt and the 3 tokens produced.
    alone = ask(QUESTION, model="whole", max_tokens=LONG)[-1].usage
    assert done.usage["prompt_tokens"] == 2 * alone["prompt_tokens"] + 3
    assert done.usage["completion_tokens"] == alone["completion_tokens"]


def test_a_stream_cut_for_good_is_continued_on_the_next_target(echo_sim, local_sim):
    cut = endpoint("cut", echo_sim, extra_headers={"X-Sim-Fail": "mid-stream;after=3"}, retries=0)
    spare = endpoint("spare", local_sim)  # an echo too: the same answer
    rule("default", cut, spare, is_default=True, use_kb_context=False)
    expected = _whole("spare")
    events = ask(QUESTION, max_tokens=LONG)
    assert [(e.target, e.continued_from) for e in events if e.type == "route"] == [
        ("cut", None),
        ("spare", "cut"),
    ]
    done = events[-1]
    assert done.type == "done" and done.target == "spare" and done.continued == ("spare",)
    assert answer_text(events) == expected


@pytest.mark.parametrize(
    ("fault", "idle"),
    [("stall;after=3;times=1", 0.5), ("no-done;after=3;times=1", 2), ("malformed;after=3", 2)],
)
def test_a_stall_or_a_missing_end_is_continued_and_an_unreadable_chunk_skipped(
    echo_sim, fault, idle
):
    flaky = endpoint("flaky", echo_sim, extra_headers={"X-Sim-Fail": fault}, idle_timeout=idle)
    whole = endpoint("whole", echo_sim)
    rule("default", flaky, whole, is_default=True, use_kb_context=False)
    expected = _whole("whole")
    events = ask(QUESTION, max_tokens=LONG)
    done = events[-1]
    assert done.type == "done" and done.target == "flaky" and answer_text(events) == expected
    if fault.startswith("malformed"):
        assert done.continued == () and done.skipped_chunks == 1
    else:
        assert done.continued == ("flaky",)


def test_a_prefill_refusal_never_hides_the_real_failure(local_sim):
    cut = endpoint("cut", local_sim, extra_headers={"X-Sim-Fail": "mid-stream;after=3"}, retries=0)
    proud = endpoint("proud", local_sim, extra_headers={"X-Sim-Fail": "no-prefill"})
    rule("default", cut, proud, is_default=True, use_kb_context=False)
    events = ask(QUESTION, max_tokens=LONG)
    error = events[-1]
    assert error.type == "error" and error.partial and error.target == "cut"
    assert error.code == "stream_truncated"  # not proud's 400
    assert [e.target for e in events if e.type == "route"] == ["cut"]
    assert answer_text(events)  # the partial answer the user keeps, marked partial


def test_an_external_endpoint_continues_only_where_its_row_says_it_accepts_prefill(
    local_sim, external_sim
):
    cut = endpoint("cut", local_sim, extra_headers={"X-Sim-Fail": "mid-stream;after=3"}, retries=0)
    plain = endpoint("plain", external_sim, kind="external")
    rule("default", cut, plain, is_default=True, use_kb_context=False)
    error = ask(QUESTION, max_tokens=LONG)[-1]
    assert error.type == "error" and error.partial and error.code == "stream_truncated"

    plain.accepts_prefill = True
    plain.save()
    from routing.rules import rules_changed

    rules_changed()
    events = ask(QUESTION, max_tokens=LONG)
    assert events[-1].type == "done" and events[-1].continued == ("plain",)
    assert kinds(events).count("route") == 2
