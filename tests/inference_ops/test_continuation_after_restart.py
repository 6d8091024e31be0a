"""An answer cut because its engine died is finished by the same engine once its supervisor has
started it again (on the simulator; tests/inference_ops/test_vllm_continuation.py has it on the
real vLLM). The continuation waits for the supervisor's word on the engine the
gateway reported gone, then for its start, within the endpoint's first-token budget, rather than
failing on its closed port.

All of it real: the engine is a supervised simulator row, slow to open its port again
(--startup-duration), killed mid-answer by the relay in front of it; the gateway (daphne) reports
it, and the Celery worker's check finds it dead and restarts it. A seeded answer is as fixed as a
greedy one: the user's answer must read as the one no fault touched."""

import openai
import pytest

from inference_ops import engine_processes, supervisor
from inference_ops.models import EngineEvent, EngineProcess
from tests.inference_ops.relays import (
    ANSWER_TOKENS,
    KillingRelay,
    sdk_client,
    streamed,
    supervised,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.processes

SEED = 41


def _supervised(relay: KillingRelay, *, first_token_timeout: float, startup: float):
    return supervised(
        relay,
        model="acme/base",
        endpoint_fields=dict(first_token_timeout=first_token_timeout, idle_timeout=10),
        kind="simulator",
        startup_timeout=60,
        stop_timeout=3,
        extra_args=[
            "--startup-duration",
            str(startup),
            "--time-to-first-token",
            "5",
            "--inter-token-latency",
            "20",
        ],
    )


def _ready_again(engine: EngineProcess, killed: int | None) -> EngineProcess | None:
    row = EngineProcess.objects.get(pk=engine.pk)
    return row if row.status == "ready" and row.pid not in (None, killed) else None


@pytest.mark.django_db(transaction=True)
def test_an_answer_cut_by_its_engine_dying_is_finished_by_the_same_engine_restarted(
    asgi_server, celery_worker, alice_key
):
    with KillingRelay() as relay:
        engine = _supervised(relay, first_token_timeout=60, startup=3)
        try:
            first = supervisor.engine_start(engine_id=engine.pk)
            client = sdk_client(asgi_server, alice_key, timeout=120)
            relay.armed = False
            expected, finish, _, _ = streamed(client, "auto", seed=SEED)
            assert finish == "length" and expected
            relay.armed = True

            text, finish, usage, continued = streamed(client, "auto", seed=SEED)
            again = wait_until(lambda: _ready_again(engine, relay.killed_pid), timeout=30)
        finally:
            supervisor.engine_stop(engine_id=engine.pk)

    assert relay.killed_pid == first.pid and relay.continued == 1
    assert text == expected  # nothing lost, nothing repeated
    assert finish == "length" and continued == ["own"]
    assert usage is not None and usage["completion_tokens"] == ANSWER_TOKENS
    assert again and not engine_processes.process_alive(first.pid)
    events = EngineEvent.objects.filter(engine=engine).order_by("at", "id")
    history = list(events.values_list("status", flat=True))
    assert history[:4] == ["starting", "ready", "restarting", "starting"], history


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_restarts_past_the_first_token_budget_leaves_the_answer_partial(
    asgi_server, celery_worker, alice_key
):
    """No wait past the budget: the caller gets what it has, marked as cut, with the failure that
    cut it (never one about the engine starting in its place), and the engine is not asked."""
    with KillingRelay() as relay:
        engine = _supervised(relay, first_token_timeout=2, startup=30)
        try:
            supervisor.engine_start(engine_id=engine.pk)
            client = sdk_client(asgi_server, alice_key, timeout=120)
            text = []
            with pytest.raises(openai.APIError) as cut:
                stream = client.chat.completions.create(
                    model="auto",
                    messages=[{"role": "user", "content": "Count on"}],
                    max_tokens=ANSWER_TOKENS,
                    stream=True,
                    extra_body={"ignore_eos": True, "seed": SEED},
                )
                for chunk in stream:
                    text += [choice.delta.content or "" for choice in chunk.choices]
        finally:
            supervisor.engine_stop(engine_id=engine.pk)

    assert relay.killed_pid is not None and relay.continued == 0
    assert "".join(text)  # the tokens before the cut reached the caller
    assert "starting" not in str(cut.value)
