"""An engine that answers 429 with Retry-After is left alone that long, by every process; the
chain's next target answers meanwhile, and when none can, the error says when to come back."""

import email.utils
import time

import pytest
from asgiref.sync import async_to_sync

from inference_ops.sdk_errors import retry_after
from routing import breaker
from tests.support.answers import ask
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.django_db


def test_a_429_with_retry_after_rests_the_endpoint_and_the_next_target_answers(
    local_sim, external_sim
):
    busy = endpoint(
        "busy", local_sim, extra_headers={"X-Sim-Fail": "429"}
    )  # the simulator sends Retry-After: 1
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", busy, spare, is_default=True, use_kb_context=False)

    first = ask("hi", max_tokens=2)
    assert first[0].target == "spare" and "busy: rate_limited" in first[0].why
    state = async_to_sync(breaker.state)("busy")
    assert state.state == "resting" and 0 < state.retry_in <= 1
    assert state.failures == 0  # a request to wait is not a failure: the breaker does not open

    second = ask("hi", max_tokens=2)
    assert second[0].target == "spare"
    assert "busy: circuit open or resting after a Retry-After" in second[0].why  # no request sent

    time.sleep(1.1)
    third = ask("hi", max_tokens=2)
    assert "busy: rate_limited" in third[0].why  # asked again once the rest was over


def test_when_every_target_rests_the_error_says_when_to_come_back(local_sim):
    busy = endpoint("busy", local_sim, extra_headers={"X-Sim-Fail": "429"})
    rule("default", busy, is_default=True, use_kb_context=False)
    (error,) = ask("hi", max_tokens=2)
    assert error.type == "error" and error.code == "rate_limited" and error.retryable
    assert 0 < error.retry_after <= 1
    (again,) = ask("hi", max_tokens=2)
    assert again.code == "unavailable" and "busy: circuit open or resting" in again.message
    assert 0 < again.retry_after <= 1


def test_a_retry_after_beyond_the_cap_rests_only_the_cap(settings):
    settings.ROUTING_MAX_RETRY_AFTER = 5
    assert async_to_sync(breaker.rest)("slow", 3600) == 5
    assert 4 < async_to_sync(breaker.state)("slow").retry_in <= 5


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_and_milliseconds(headers, seconds):
    assert retry_after(headers) == seconds


def test_retry_after_reads_an_http_date():
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < retry_after({"retry-after": in_a_minute}) <= 60
    assert (
        retry_after({"retry-after": email.utils.formatdate(time.time() - 60, usegmt=True)}) == 0.0
    )
