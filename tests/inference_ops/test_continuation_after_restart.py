"""An answer cut because its engine died is finished by the same engine once its supervisor has
started it again (issue 41, item 7, on the simulator; tests/inference_ops/test_vllm_continuation.py
has it on the real vLLM). The continuation waits for the engine within the endpoint's first-token
budget, as a question that meets a starting engine does, rather than failing on its closed port.

The engine is a supervised simulator row, slow to open its port again (--startup-duration); the
relay in front of it kills it mid-answer and has the supervisor restart it. A seeded answer is as
fixed as a greedy one: the user's answer must read as the one no fault touched."""

import pytest

from inference_ops import engine_processes, supervisor
from inference_ops.models import EngineProcess
from tests.inference_ops.relays import (
    ANSWER_TOKENS,
    RestartingRelay,
    sdk_client,
    streamed,
    supervised,
)

pytestmark = pytest.mark.processes

SEED = 41


def _supervised(relay: RestartingRelay, *, first_token_timeout: float, startup: float):
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


@pytest.mark.django_db(transaction=True)
def test_an_answer_cut_by_its_engine_dying_is_finished_by_the_same_engine_restarted(
    asgi_server, alice_key
):
    with RestartingRelay() as relay:
        engine = _supervised(relay, first_token_timeout=60, startup=3)
        try:
            first = supervisor.engine_start(engine_id=engine.pk)
            client = sdk_client(asgi_server, alice_key, timeout=120)
            relay.armed = False
            expected, finish, _, _ = streamed(client, "auto", seed=SEED)
            assert finish == "length" and expected
            relay.armed = True

            text, finish, usage, continued = streamed(client, "auto", seed=SEED)
            relay.restart_join(60)
        finally:
            supervisor.engine_stop(engine_id=engine.pk)

    assert relay.killed_pid == first.pid and relay.checked == "scheduled"
    assert relay.restarted == ["ready"] and relay.continued == 1
    assert text == expected  # nothing lost, nothing repeated
    assert finish == "length" and continued == ["own"]
    assert usage is not None and usage["completion_tokens"] == ANSWER_TOKENS
    assert not engine_processes.process_alive(first.pid)


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_restarts_past_the_first_token_budget_leaves_the_answer_partial(
    asgi_server, alice_key
):
    """No wait past the budget: the caller gets what it has, marked as cut, with the failure that
    cut it (never one about the engine starting in its place)."""
    import openai

    with RestartingRelay() as relay:
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
            relay.restart_join(60)

    assert relay.killed_pid is not None and relay.continued == 0
    assert "".join(text)  # the tokens before the cut reached the caller
    assert "starting" not in str(cut.value)
    assert EngineProcess.objects.get(pk=engine.pk).status == "stopped"
