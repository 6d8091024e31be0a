"""An answer cut mid-stream is finished by the real vLLM from where it was cut.

The real engine is what these prove: it takes the partial answer as an assistant prefill
(`continue_final_message`) and goes on with the tokens it would have given anyway, so the
user's answer is the same, token for token, as the one no fault touched. Greedy decoding makes
that answer known: it is asked for once, uncut, through the same gateway.

Three cuts: a relay in front of the real vLLM that drops the connection after a few content
chunks (continued by the same engine, or by the next target of the chain); the engine itself
SIGKILLed mid-answer (a second real vLLM of its own, continued by the shared one); and a real
vLLM of the supervisor's SIGKILLed mid-answer and started again, which continues the answer once
it is back (the request waits for it within its endpoint's first-token budget).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from benchmarks.engines import bundled_vllm_fields
from inference_ops import engine_processes, supervisor
from inference_ops.models import EngineProcess
from tests.inference_ops.engines import BASE, MAX_MODEL_LEN, start_engine
from tests.inference_ops.relays import (
    ANSWER_TOKENS,
    CuttingRelay,
    KillingRelay,
    sdk_client,
    streamed,
    supervised,
)
from tests.support.factories import endpoint, rule

pytestmark = pytest.mark.engines

TIMEOUTS = dict(first_token_timeout=60, idle_timeout=30, total_timeout=120)


def _uncut(client) -> str:
    """The greedy answer no fault touched, through the same gateway (the fallback named)."""
    text, finish, usage, _ = streamed(client, "whole")
    assert finish == "length" and usage and usage["completion_tokens"] == ANSWER_TOKENS
    return text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["same", "next"])
def test_an_answer_cut_mid_stream_is_finished_by_the_real_vllm_token_for_token(
    real_vllm, asgi_server, alice_key, where
):
    with CuttingRelay(real_vllm.url) as relay:
        # "same": the cut endpoint takes the continuation (it may be retried); "next": it may
        # not, so the chain's next target, the same engine reached directly, finishes it.
        cut = endpoint(
            "cut",
            url=relay.url + "/v1",
            model=BASE,
            retries=2 if where == "same" else 0,
            **TIMEOUTS,
        )
        whole = endpoint("whole", real_vllm, model=BASE, **TIMEOUTS)
        rule("default", cut, whole, is_default=True, use_kb_context=False)
        client = sdk_client(asgi_server, alice_key)
        expected = _uncut(client)

        text, finish, usage, continued = streamed(client, "auto")

    assert relay.cuts == 1 and relay.continued == (1 if where == "same" else 0)
    assert text == expected  # nothing lost, nothing repeated
    assert finish == "length"
    # Every attempt's tokens: those before the cut and those after add up to the ceiling.
    assert usage is not None and usage["completion_tokens"] == ANSWER_TOKENS
    assert continued == ["cut" if where == "same" else "whole"]


@contextlib.contextmanager
def _second_vllm(tmp_path, django_db_blocker) -> Iterator:
    with start_engine("vllm", tmp_path, django_db_blocker) as running:
        yield running


@pytest.mark.django_db(transaction=True)
def test_a_real_vllm_sigkilled_mid_answer_has_its_answer_finished_by_the_other(
    real_vllm, asgi_server, alice_key, tmp_path, django_db_blocker
):
    """The engine's process group killed after its first tokens: the answer goes on on the
    chain's next target (the shared real vLLM), from the text the user already has."""
    with _second_vllm(tmp_path, django_db_blocker) as doomed:
        killer = _KillAfterFirstTokens(doomed)
        with killer:
            first = endpoint("first", url=killer.url + "/v1", model=BASE, retries=0, **TIMEOUTS)
            whole = endpoint("whole", real_vllm, model=BASE, **TIMEOUTS)
            rule("default", first, whole, is_default=True, use_kb_context=False)
            client = sdk_client(asgi_server, alice_key)
            expected = _uncut(client)
            text, finish, usage, continued = streamed(client, "auto")
        assert killer.killed
    assert text == expected
    assert finish == "length" and usage is not None
    assert usage["completion_tokens"] == ANSWER_TOKENS
    assert continued == ["whole"]


class _KillAfterFirstTokens(CuttingRelay):
    """A relay that, instead of dropping the connection, SIGKILLs the engine's whole process
    group (its API server and EngineCore) once CUT_AFTER content chunks went through: the stream
    then breaks as a dead engine's does."""

    def __init__(self, engine):
        super().__init__(engine.url)
        self.engine = engine
        self.killed = False

    def cut(self) -> bool:
        if not self.killed:
            self.killed = True
            os.killpg(os.getpgid(self.engine.pid), signal.SIGKILL)
        return False  # the dead engine's stream breaks by itself, and so does the one relayed


# A real vLLM starts in 75 s on this CPU with VNNI, about twice that without or under load
# (docs/local-engine.md): its restart must fit in the continuation's first-token budget.
RESTART_BUDGET = 480


@pytest.mark.django_db(transaction=True)
# The real vLLM starts twice (before the kill and after it), each bounded by its startup_timeout.
@pytest.mark.timeout(1500)
def test_an_answer_cut_by_the_real_vllm_dying_is_finished_by_the_same_vllm_restarted(
    asgi_server, celery_worker, alice_key
):
    """A real vLLM of the supervisor's, SIGKILLed after its first tokens: the gateway reports it,
    the Celery worker's check finds it dead and starts it again, and meanwhile the request waits;
    the restarted engine continues the answer from the text the user already has, token for token
    the greedy answer no fault touched."""
    fields = bundled_vllm_fields(max_num_seqs=4, max_model_len=MAX_MODEL_LEN, kv_cache_mb=256)
    with KillingRelay() as relay:
        engine = supervised(
            relay,
            model=fields.pop("model"),
            endpoint_fields=dict(
                first_token_timeout=RESTART_BUDGET, idle_timeout=30, total_timeout=RESTART_BUDGET
            ),
            startup_timeout=RESTART_BUDGET,
            stop_timeout=15,
            **fields,
        )
        try:
            first = supervisor.engine_start(engine_id=engine.pk)
            client = sdk_client(asgi_server, alice_key, timeout=RESTART_BUDGET + 60)
            relay.armed = False  # the uncut answer first, from the same engine
            expected, finish, usage, _ = streamed(client, "auto")
            assert finish == "length" and usage and usage["completion_tokens"] == ANSWER_TOKENS
            relay.armed = True

            gaps: list[float] = []
            text, finish, usage, continued = streamed(client, "auto", gaps)
            row = EngineProcess.objects.get(pk=engine.pk)
        finally:
            supervisor.engine_stop(engine_id=engine.pk)

    assert relay.killed_pid == first.pid and relay.continued == 1
    assert row.status == "ready" and row.pid != first.pid  # the same row's engine, started again
    assert text == expected  # nothing lost, nothing repeated
    assert finish == "length" and continued == ["own"]
    assert usage is not None and usage["completion_tokens"] == ANSWER_TOKENS
    assert not engine_processes.process_alive(first.pid)
    # The cost of the continuation: from the last token before the cut to the first after it.
    print(f"from the cut to the restarted engine's next token: {max(gaps):.1f} s")
