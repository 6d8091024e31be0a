"""The answer pipeline end to end: KB road, rules, fallback, breaker, cancellation."""

import asyncio
import contextlib
import subprocess
import sys

import aiohttp
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from knowledge.services.entries import entry_create
from routing import breaker, pipeline
from routing.events import RouteRequest
from tests.support.answers import answer_text, ask, kinds
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def roads(local_sim, external_sim):
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    default = rule("default", local, external, is_default=True, priority=1000, use_kb_context=False)
    return local, external, default


def test_a_kb_question_is_answered_from_the_kb_without_a_model(roads):
    entry = entry_create(
        question="How do I reset my password?", answer="Use *Forgot password*.", embed="sync"
    )
    events = ask("how do i reset my password")
    assert kinds(events) == ["route", "token", "done"]
    route, token, done = events
    assert (route.road, route.target) == ("kb", f"KB#{entry.pk}")
    assert token.text == "Use *Forgot password*."
    assert done.kb_entry_id == entry.pk and done.usage is None and done.latency_ms >= 0


def test_other_questions_stream_from_the_local_engine(roads):
    events = ask("Tell me a long story about the old lighthouses of Brittany", max_tokens=6)
    # Chunks that arrive in one network read leave as one token event (inference_ops.client), so
    # a loaded machine may show fewer than 6 events for the 6 tokens: the usage counts them.
    tokens = kinds(events)[1:-1]
    assert kinds(events)[0] == "route" and kinds(events)[-1] == "done"
    assert 1 <= len(tokens) <= 6 and set(tokens) == {"token"} and answer_text(events)
    route, done = events[0], events[-1]
    assert (route.road, route.rule, route.target) == ("local", "default", "local")
    assert done.usage["completion_tokens"] == 6 and done.finish_reason == "length"
    assert done.ttft_ms is not None and done.ttft_ms <= done.latency_ms


def test_empty_and_oversized_questions_are_refused(roads, settings):
    assert ask("   ")[0].code == "empty"
    settings.ROUTING_MAX_INPUT_CHARS = 100
    error = ask("x" * 101)[0]
    assert error.code == "too_long" and "limit is 100" in error.message


def test_a_question_too_long_for_the_context_window_names_the_limit(local_sim):
    small = endpoint("small", local_sim, context_window=300)
    rule("default", small, is_default=True, use_kb_context=False, max_tokens=100)
    (error,) = ask("word " * 400)
    assert error.code == "too_long"
    assert "small accepts at most 300 tokens" in error.message


@pytest.mark.parametrize("fault", ["500", "429", "hang", "connect-refused"])
def test_it_falls_back_before_the_first_token(local_sim, external_sim, fault):
    if fault == "connect-refused":
        broken = endpoint("broken", url="http://127.0.0.1:1/v1")
    else:
        broken = endpoint(
            "broken", local_sim, extra_headers={"X-Sim-Fail": fault}, first_token_timeout=0.5
        )
    external = endpoint("external", external_sim, kind="external")
    rule("default", broken, external, is_default=True, use_kb_context=False)
    events = ask("Summarise the plot of Hamlet", max_tokens=5)
    route, done = events[0], events[-1]
    assert (route.road, route.target, done.type) == ("external", "external", "done")
    assert "fell back after broken:" in route.why
    assert answer_text(events)


def test_it_never_switches_after_the_first_token(local_sim, external_sim):
    flaky = endpoint("flaky", local_sim, extra_headers={"X-Sim-Fail": "mid-stream"})
    external = endpoint("external", external_sim, kind="external")
    rule("default", flaky, external, is_default=True, use_kb_context=False)
    events = ask("Tell me a long story", max_tokens=50)
    assert events[0].target == "flaky"
    assert "token" in kinds(events)
    error = events[-1]
    assert error.type == "error" and error.partial is True and error.target == "flaky"
    assert all(e.type != "route" or e.target == "flaky" for e in events)


def test_a_client_error_does_not_fall_back(local_sim, external_sim):
    wrong = endpoint("wrong", local_sim, model="no-such-model")
    external = endpoint("external", external_sim, kind="external")
    rule("default", wrong, external, is_default=True, use_kb_context=False)
    (error,) = ask("Hello there")
    assert error.code == "client_error" and not error.retryable and "wrong" in error.message


def test_when_every_target_fails_the_error_lists_them(local_sim):
    a = endpoint("a", url="http://127.0.0.1:1/v1")
    b = endpoint("b", local_sim, extra_headers={"X-Sim-Fail": "500"})
    rule("default", a, b, is_default=True, use_kb_context=False)
    (error,) = ask("Hello there")
    assert error.type == "error" and error.retryable
    # Each tried again twice (the endpoints' default) before the next.
    assert (
        error.message == "No target could answer: a: connect (3 tries); b: server_error (3 tries)"
    )


def test_a_requested_model_forces_its_target_and_skips_the_kb(roads):
    entry_create(question="Hello there", answer="From the KB.", embed="sync")
    events = ask("Hello there", model="external", max_tokens=3)
    assert events[0].road == "external" and events[0].target == "external"
    assert ask("Hello", model="nope")[0].code == "unknown_model"


def test_kb_only_rules_say_the_kb_has_no_answer(roads, settings):
    rule("policies", keywords=["refund"], action="kb_only", priority=1)
    events = ask("What is your refund policy for opened software?")
    assert kinds(events) == ["route", "token", "done"]
    assert events[0].road == "kb" and events[0].rule == "policies"
    assert events[1].text == settings.ROUTING_KB_NO_ANSWER


def test_kb_context_goes_into_the_prompt_with_citations(local_sim):
    entry = entry_create(
        kind="rule",
        question="Refund policy",
        answer="Refunds within 30 days of delivery.",
        embed="sync",
    )
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=True, context_k=2)
    done = ask("Can I get my money back?", max_tokens=3)[-1]
    assert done.citations == [{"entry_id": entry.pk, "label": f"KB#{entry.pk}: Refund policy"}]
    assert done.usage["prompt_tokens"] > 20  # the passage was sent along


def test_history_is_trimmed_to_the_context_window(local_sim):
    narrow = endpoint("narrow", local_sim, context_window=400)
    rule("default", narrow, is_default=True, use_kb_context=False, max_tokens=50)
    history = []
    for i in range(30):
        history += [
            {"role": "user", "content": f"question {i} " + "blah " * 10},
            {"role": "assistant", "content": f"answer {i} " + "blah " * 10},
        ]
    events = ask("And the last one?", history=history, max_tokens=5)
    assert events[-1].type == "done"
    assert "oldest history message(s) left out" in events[0].why
    assert events[-1].usage["prompt_tokens"] < 400


# --- circuit breaker -----------------------------------------------------------------------------


def test_the_breaker_opens_skips_the_target_then_probes_and_closes(
    local_sim, external_sim, settings
):
    settings.ROUTING_BREAKER_FAILURES = 2
    settings.ROUTING_BREAKER_COOLDOWN = 0.5
    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"})
    external = endpoint("external", external_sim, kind="external")
    rule("default", down, external, is_default=True, use_kb_context=False)
    for _ in range(2):
        assert "down: server_error" in ask("hi", max_tokens=2)[0].why
    state = async_to_sync(breaker.state)("down")
    assert state.state == "open" and state.failures == 2
    assert "down: circuit open" in ask("hi", max_tokens=2)[0].why  # skipped, no request sent

    import time

    time.sleep(0.6)
    assert async_to_sync(breaker.state)("down").state == "half_open"
    # The probe goes to the (still failing) endpoint and re-opens the breaker.
    assert "down: server_error" in ask("hi", max_tokens=2)[0].why
    assert async_to_sync(breaker.state)("down").state == "open"

    type(down).objects.filter(pk=down.pk).update(extra_headers={})
    from routing.rules import rules_changed

    rules_changed()
    time.sleep(0.6)
    events = ask("hi", max_tokens=2)
    assert events[0].target == "down"  # the probe succeeds
    assert async_to_sync(breaker.state)("down").state == "closed"


@pytest.mark.processes
def test_the_breaker_is_shared_by_processes(child_env, settings):
    settings.ROUTING_BREAKER_FAILURES = 1
    # No probe due while the child starts, however slowly on a loaded machine: the first probe
    # waits the lesser of the two.
    settings.ROUTING_BREAKER_PROBE_FIRST = 600
    settings.ROUTING_BREAKER_COOLDOWN = 600
    async_to_sync(breaker.failure)("shared")
    script = (
        "import asyncio, django; django.setup(); from routing import breaker; "
        "print(asyncio.run(breaker.allow('shared')))"
    )
    env = {**child_env, "ROUTING_BREAKER_FAILURES": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


# --- concurrency and cancellation ----------------------------------------------------------------


async def _running(sim) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{sim.url}/metrics") as response:
            text = await response.text()
    running = next(
        line for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )
    return float(running.rsplit(" ", 1)[1])


def test_cancelling_the_answer_stops_the_upstream_generation(local_sim):
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=False)

    async def scenario():
        first = asyncio.Event()

        async def consume():
            async for event in pipeline.answer(RouteRequest(text="word " * 200, max_tokens=400)):
                if event.type == "token":
                    first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 10)
        during = await _running(local_sim)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(50):
            if await _running(local_sim) == 0:
                break
            await asyncio.sleep(0.02)
        return during, await _running(local_sim)

    during, after = async_to_sync(scenario)()
    assert during >= 1 and after == 0


def test_concurrent_questions_are_concurrent_upstream_streams(local_sim):
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=False)

    async def scenario():
        loop = asyncio.get_running_loop()

        async def one(i):
            first = None
            async for event in pipeline.answer(
                RouteRequest(text=f"story {i} " * 30, max_tokens=40)
            ):
                if event.type == "token" and first is None:
                    first = loop.time()
            return first, loop.time(), event.type

        return await asyncio.gather(*(one(i) for i in range(6)))

    results = async_to_sync(scenario)()
    assert [r[2] for r in results] == ["done"] * 6
    # Not one lane: every answer had started streaming before the first one finished.
    assert max(first for first, _, _ in results) < min(end for _, end, _ in results)


def test_a_warm_pipeline_runs_no_rule_query(roads):
    ask("warm up", max_tokens=2)
    with CaptureQueriesContext(connection) as queries:
        events = ask("Tell me about ships", max_tokens=2)
    assert events[-1].type == "done"
    assert not [q["sql"] for q in queries if "routing_" in q["sql"] or "inference_ops_" in q["sql"]]


@pytest.mark.django_db(transaction=True)
def test_a_generated_answer_is_recorded_as_a_kb_miss_by_the_worker(
    local_sim, celery_worker, settings
):
    import time

    from knowledge.models import Miss

    settings.KB_RECORD_MISSES = True
    local = endpoint("local", local_sim)
    rule("default", local, is_default=True, use_kb_context=False)
    events = ask("Do you sell gift cards for birthdays?", max_tokens=4)
    assert events[-1].type == "done"
    deadline = time.monotonic() + 60
    while not Miss.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    miss = Miss.objects.get()
    assert miss.question == "Do you sell gift cards for birthdays?"
    assert miss.answer == answer_text(events)


def test_a_follow_up_in_a_conversation_is_not_answered_from_the_kb(roads):
    """Its words match a stand-alone entry, but "that" is whatever the conversation was about."""
    entry_create(question="And how long does that take?", answer="About a week.", embed="sync")
    alone = ask("And how long does that take?")
    assert alone[0].road == "kb"  # asked on its own, the entry answers
    history = [
        {"role": "user", "content": "Can I change the name on my invoice?"},
        {"role": "assistant", "content": "Yes, from the billing page."},
    ]
    events = ask("And how long does that take?", history=history, max_tokens=3)
    assert events[0].road == "local" and events[-1].type == "done"
    chinese = entry_create(question="那要多久？", answer="大约一周。", embed="sync")
    assert ask("那要多久？")[0].target == f"KB#{chinese.pk}"
    assert ask("那要多久？", history=history, max_tokens=3)[0].road == "local"
    # A question of its own in the same conversation still gets its direct answer.
    entry_create(question="What is your refund window?", answer="30 days.", embed="sync")
    assert ask("What is your refund window?", history=history)[0].road == "kb"


def test_a_request_a_stored_text_cannot_satisfy_skips_the_kb_and_the_route_says_why(roads):
    from routing.events import Passthrough

    entry_create(
        question="How do I reset my password?", answer="Use *Forgot password*.", embed="sync"
    )
    question = {"role": "user", "content": "how do i reset my password"}
    events = ask(
        "how do i reset my password",
        max_tokens=4,
        passthrough=Passthrough(question=question, not_plain="tool_choice requires a tool call"),
    )
    route = events[0]
    assert route.road == "local" and events[-1].type == "done"
    assert "the knowledge base was not asked: tool_choice requires a tool call" in route.why
