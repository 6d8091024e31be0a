"""Retries before the first token: a transient failure is tried again on the same target, a
bounded number of times with backoff (or its Retry-After, when that fits), then the chain's next
target; a request the engine refuses is never retried; a prompt too long for one engine goes to a
larger one; a content-policy refusal reaches the client with the provider's reason."""

import random
import time

import pytest
from asgiref.sync import async_to_sync

from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.exceptions import EngineError
from routing import breaker
from routing.compiled import Target
from routing.failures import retry_wait
from tests.inference_ops.simulator_process import start_simulator
from tests.support.answers import answer_text, ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_sim():
    """A simulator of this test's own: a fault with `times=N` counts the requests of one
    simulator process, which a shared one would have counted for earlier tests."""
    sim = start_simulator("serve", "acme/local", "--time-to-first-token", "5")
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def narrow_sim():
    """An engine whose context window is smaller than its endpoint row says."""
    sim = start_simulator("serve", "acme/local", "--max-model-len", "300")
    yield sim
    sim.stop()


def test_a_500_once_is_retried_on_the_same_target_which_answers(own_sim, external_sim):
    flaky = endpoint("flaky", own_sim, extra_headers={"X-Sim-Fail": "500;times=1"})
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", flaky, spare, is_default=True, use_kb_context=False)
    events = ask("Summarise the plot of Hamlet", max_tokens=3)
    route, done = events[0], events[-1]
    assert (route.target, done.type, done.fell_back_from) == ("flaky", "done", ())
    assert [(endpoint, kind) for endpoint, kind, _ in done.retried] == [("flaky", "server_error")]
    assert "retried flaky: server_error, tried again after" in route.why
    assert answer_text(events)


def test_a_reset_before_the_headers_is_retried_on_the_same_target(own_sim):
    flaky = endpoint("flaky", own_sim, extra_headers={"X-Sim-Fail": "connect-close;times=2"})
    rule("default", flaky, is_default=True, use_kb_context=False)
    done = ask("Hello there", max_tokens=2)[-1]
    assert done.type == "done" and done.target == "flaky" and len(done.retried) == 2


def test_a_target_that_keeps_failing_is_retried_within_its_bound_then_the_next_answers(
    local_sim, external_sim
):
    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=2)
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", down, spare, is_default=True, use_kb_context=False)
    events = ask("Summarise the plot of Hamlet", max_tokens=3)
    route, done = events[0], events[-1]
    assert (route.target, done.type, done.fell_back_from) == ("spare", "done", ("down",))
    assert [kind for _, kind, _ in done.retried] == ["server_error", "server_error"]
    assert "fell back after down: server_error (3 tries)" in route.why


def test_an_endpoint_with_no_retries_goes_straight_to_the_next_target(local_sim, external_sim):
    down = endpoint("down", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=0)
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", down, spare, is_default=True, use_kb_context=False)
    done = ask("Hello there", max_tokens=2)[-1]
    assert done.target == "spare" and done.retried == ()


def test_a_429s_retry_after_is_waited_when_it_fits_the_first_token_budget(local_sim, external_sim):
    # The simulator's 429 asks for 1 s, which fits in the endpoint's 3 s to its first token: one
    # retry (its bound) after 1 s, then the next target answers.
    busy = endpoint(
        "busy", local_sim, extra_headers={"X-Sim-Fail": "429"}, first_token_timeout=3, retries=1
    )
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", busy, spare, is_default=True, use_kb_context=False)
    done = ask("Hello there", max_tokens=2)[-1]
    assert done.target == "spare" and done.retried == (("busy", "rate_limited", 1.0),)
    assert async_to_sync(breaker.state)("busy").state == "resting"


def test_a_429_asking_longer_than_the_budget_goes_to_the_next_target_at_once(
    local_sim, external_sim
):
    busy = endpoint("busy", local_sim, extra_headers={"X-Sim-Fail": "429"}, first_token_timeout=1)
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", busy, spare, is_default=True, use_kb_context=False)
    done = ask("Hello there", max_tokens=2)[-1]
    assert done.target == "spare" and done.retried == ()
    assert async_to_sync(breaker.state)("busy").state == "resting"


def test_a_429_once_with_retry_after_is_answered_by_the_same_target(own_sim, external_sim):
    busy = endpoint(
        "busy",
        own_sim,
        extra_headers={"X-Sim-Fail": "429;retry-after=1;times=1"},
        first_token_timeout=3,
    )
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", busy, spare, is_default=True, use_kb_context=False)
    done = ask("Hello there", max_tokens=2)[-1]
    assert done.target == "busy" and done.retried == (("busy", "rate_limited", 1.0),)


def test_a_request_the_engine_refuses_is_never_retried(local_sim, external_sim):
    wrong = endpoint("wrong", local_sim, model="no-such-model")
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", wrong, spare, is_default=True, use_kb_context=False)
    (error,) = ask("Hello there")
    assert error.code == "client_error" and error.retried == ()


def test_a_prompt_too_long_for_one_engine_goes_to_a_larger_window(narrow_sim, external_sim):
    # The row says 4096 tokens; the engine holds 300 and says so in its 400.
    narrow = endpoint("narrow", narrow_sim, context_window=4096)
    wide = endpoint("wide", external_sim, kind="external", context_window=8192)
    rule("default", narrow, wide, is_default=True, use_kb_context=False, max_tokens=20)
    events = ask("word " * 400)
    route, done = events[0], events[-1]
    assert (route.target, done.type) == ("wide", "done")
    assert "narrow: context_length" in route.why and done.retried == ()


def test_a_prompt_too_long_for_every_engine_is_a_400_naming_the_limit(narrow_sim, local_sim):
    narrow = endpoint("narrow", narrow_sim, context_window=4096)
    # No larger than what the first engine said it holds: not tried.
    small = endpoint("small", local_sim, context_window=300)
    rule("default", narrow, small, is_default=True, use_kb_context=False, max_tokens=20)
    (error,) = ask("word " * 400)
    assert error.code == "too_long" and error.target == "narrow"
    assert "maximum context length is 300 tokens" in error.message
    assert error.as_dict()["message"] == error.message  # about the request: the user reads it


def test_a_content_policy_refusal_reaches_the_client_with_its_reason(local_sim, external_sim):
    strict = endpoint("strict", local_sim, extra_headers={"X-Sim-Fail": "content-filter"})
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", strict, spare, is_default=True, use_kb_context=False)
    (error,) = ask("Hello there")
    assert error.code == "content_filter" and not error.retryable and error.target == "strict"
    assert error.retried == () and error.fell_back_from == ()
    assert error.message and error.as_dict()["message"] == error.message


def _target(**config) -> Target:
    return Target(
        endpoint_id=1,
        endpoint="any",
        road="local",
        position=1,
        weight=1,
        config=EndpointConfig(name="any", base_url="http://127.0.0.1:1/v1", model="m", **config),
        context_window=4096,
    )


@pytest.mark.parametrize(
    ("kind", "status"),
    [("client_error", 404), ("timeout_total", None), ("malformed", None), ("content_filter", 400)],
)
def test_what_would_fail_again_gets_no_wait(kind, status):
    exc = EngineError(kind, "x", status_code=status)
    assert retry_wait(_target(), exc, 1, time.monotonic(), random.Random(1)) is None


def test_the_backoff_is_jittered_and_capped():
    target = _target(retries=10, retry_base=0.5, retry_cap=1.0, first_token_timeout=60)
    exc = EngineError("server_error", "x", status_code=500)
    rng = random.Random(7)
    now = time.monotonic()
    first = [retry_wait(target, exc, 1, now, rng) for _ in range(200)]
    late = [retry_wait(target, exc, 6, now, rng) for _ in range(200)]
    assert all(0 <= w <= 0.5 for w in first) and len(set(first)) > 100
    assert all(0 <= w <= 1.0 for w in late) and max(late) > 0.9
    assert retry_wait(target, exc, 11, now, rng) is None  # past its retries


def test_a_wait_past_the_first_token_budget_is_no_retry():
    target = _target(first_token_timeout=2)
    asks_3s = EngineError("rate_limited", "x", status_code=429, retry_after=3)
    asks_1s = EngineError("rate_limited", "x", status_code=429, retry_after=1)
    now = time.monotonic()
    assert retry_wait(target, asks_3s, 1, now, random.Random()) is None
    assert retry_wait(target, asks_1s, 1, now, random.Random()) == 1
    assert retry_wait(target, asks_1s, 1, now - 1.5, random.Random()) is None  # 1.5 s spent
