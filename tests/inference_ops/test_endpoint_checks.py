"""A target that no engine row runs: a vLLM production-stack router or llm-d's gateway behind one
OpenAI-compatible URL (here the simulator stands for it). The beat checks it as it checks an
engine: /health, the model in /v1/models, the /metrics gauges on the endpoint row."""

import threading
import urllib.request

import openai
import pytest
from asgiref.sync import async_to_sync

from inference_ops.endpoint_checks import endpoint_check
from inference_ops.models import EngineProcess, ModelEndpoint
from inference_ops.tasks import endpoints_check_all
from routing import breaker
from tests.support.factories import endpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def router():
    """Streams slowly (100 ms a token), so requests are in flight when the check scrapes."""
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve",
        "acme/local",
        "--mode",
        "echo",
        "--inter-token-latency",
        "100",
        "--max-num-seqs",
        "2",
    )
    yield sim
    sim.stop()


def _stream_for_a_while(url: str, done: threading.Event) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model="acme/local",
        stream=True,
        max_tokens=40,
        messages=[{"role": "user", "content": "one two three four five " * 8}],
    )
    for _ in stream:
        if done.is_set():
            break
    stream.close()


def test_a_router_is_checked_and_its_load_lands_on_the_endpoint_row(router):
    target = endpoint("router", router)
    done = threading.Event()
    streams = [
        threading.Thread(target=_stream_for_a_while, args=(router.url, done)) for _ in range(4)
    ]
    for thread in streams:
        thread.start()
    try:
        for _ in range(50):  # until the four requests are in (two run, two wait: --max-num-seqs 2)
            with urllib.request.urlopen(f"{router.url}/metrics", timeout=5) as response:
                if (
                    "vllm:num_requests_waiting" in (text := response.read().decode())
                    and 'vllm:num_requests_waiting{model_name="acme/local"} 2.0' in text
                ):
                    break
            threading.Event().wait(0.05)
        assert endpoint_check(endpoint_id=target.pk) == "ready"
    finally:
        done.set()
        for thread in streams:
            thread.join(timeout=30)
    row = ModelEndpoint.objects.get(pk=target.pk)
    assert (row.status, row.status_reason) == ("ready", "healthy")
    assert (row.requests_running, row.requests_waiting) == (2.0, 2.0) and row.checked_at is not None


def test_a_router_that_is_gone_is_down_and_back_ready_with_its_breaker_closed(router):
    target = endpoint("router", url="http://127.0.0.1:9/v1")
    assert endpoint_check(endpoint_id=target.pk) == "down"
    assert "no answer" in ModelEndpoint.objects.get(pk=target.pk).status_reason
    for _ in range(10):  # requests failed meanwhile: the breaker opened
        async_to_sync(breaker.failure)("router")
    assert async_to_sync(breaker.state)("router").state == "open"
    ModelEndpoint.objects.filter(pk=target.pk).update(base_url=f"{router.url}/v1")  # it came back
    assert endpoint_check(endpoint_id=target.pk) == "ready"
    assert async_to_sync(breaker.state)("router").state == "closed"


def test_a_router_serving_another_model_is_unhealthy(router):
    target = endpoint("router", router, model="acme/other")
    assert endpoint_check(endpoint_id=target.pk) == "unhealthy"
    assert "does not list 'acme/other'" in ModelEndpoint.objects.get(pk=target.pk).status_reason


def test_the_beat_checks_routers_but_not_engines_of_ours_nor_external_apis(router, external_sim):
    endpoint("router", router)
    endpoint("external", external_sim, kind="external")
    ours = endpoint("ours", router)
    EngineProcess.objects.create(name="gpu-1", endpoint=ours, model="acme/local", port=18001)
    assert endpoints_check_all.apply().get() == 1  # the tasks it sends run on the default queue
