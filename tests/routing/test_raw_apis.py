"""Retries of the /v1 APIs beside chat (routing.completions, routing.embeddings): embeddings tried
again on the same endpoint after a transient failure, as a chat answer is before its first token,
and never after a refusal that would come again; completions, which go down the chat pipeline's
chain, the same. The engine is the simulator over HTTP, its faults named by the endpoint's
`X-Sim-Fail` header."""

import json
import urllib.error
import urllib.request

import pytest
from asgiref.sync import async_to_sync

from observability.models import RequestLog
from routing import completions, embeddings
from routing.events import RouteRequest
from tests.inference_ops.simulator_process import start_simulator
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until

pytestmark = pytest.mark.django_db

TEXTS = ["How do I reset my password?", "Where is the lighthouse?"]


@pytest.fixture
def embed_sim():
    """An embedding model of this test's own: a fault with `times=N` counts one process's
    requests, which a shared simulator would have counted for earlier tests."""
    sim = start_simulator(
        "serve", "acme/embed", "--runner", "pooling", "--convert", "embed", "--embedding-dim", "16"
    )
    yield sim
    sim.stop()


@pytest.fixture
def own_sim():
    sim = start_simulator("serve", "acme/local", "--time-to-first-token", "5")
    yield sim
    sim.stop()


def embedder(sim, fault: str, **fields):
    made = endpoint(
        "embedder",
        sim,
        model="acme/embed",
        apis=["embeddings"],
        extra_headers={"X-Sim-Fail": fault},
        **fields,
    )
    rule("default", made, is_default=True, use_kb_context=False)
    return made


async def _collect(generator):
    return [event async for event in generator]


def embed(model="embedder"):
    request = RouteRequest(text="", model=model, api="embeddings", store=False)
    ask = embeddings.EmbeddingAsk(
        input=TEXTS, texts=TEXTS, tokens=12, encoding_format="float", dimensions=None
    )
    return async_to_sync(_collect)(embeddings.embed(request, ask))


def complete(prompt: str, model="auto"):
    request = RouteRequest(text=prompt, model=model, api="completions", max_tokens=3, store=False)
    return async_to_sync(_collect)(completions.complete(request, prompt))


# --- embeddings ----------------------------------------------------------------------------------


def test_embeddings_after_a_500_once_are_answered_by_the_same_endpoint_on_a_retry(embed_sim):
    embedder(embed_sim, "500;times=1")
    route, vectors, done = embed()
    assert (route.type, vectors.type, done.type) == ("route", "vectors", "done")
    assert len(vectors.vectors) == 2 and len(vectors.vectors[0]) == 16
    assert [(where, kind) for where, kind, _ in done.retried] == [("embedder", "server_error")]
    assert "retried embedder: server_error, tried again after" in route.why


def test_embeddings_after_a_reset_before_the_headers_are_retried(embed_sim):
    embedder(embed_sim, "connect-close;times=2")
    done = embed()[-1]
    assert done.type == "done" and [kind for _, kind, _ in done.retried] == ["connect"] * 2


def test_embeddings_wait_out_a_429s_retry_after_when_it_fits_the_budget(embed_sim):
    embedder(embed_sim, "429;retry-after=1;times=1", first_token_timeout=3)
    done = embed()[-1]
    assert done.type == "done" and done.retried == (("embedder", "rate_limited", 1.0),)


def test_embeddings_of_an_endpoint_that_keeps_failing_end_after_its_retries(embed_sim):
    embedder(embed_sim, "500", retries=2)
    (error,) = embed()
    assert error.type == "error" and error.code == "server_error" and error.retryable
    assert [kind for _, kind, _ in error.retried] == ["server_error", "server_error"]
    assert "embedder: server_error (3 tries)" in error.message


def test_embeddings_of_an_endpoint_with_no_retries_are_tried_once(embed_sim):
    embedder(embed_sim, "500;times=1", retries=0)
    (error,) = embed()
    assert error.code == "server_error" and error.retried == ()


def test_a_400_refusing_embeddings_is_not_retried(embed_sim):
    # Once only: a retry would be answered, so an answer here would be a retry of a 400.
    embedder(embed_sim, "content-filter;reason=self-harm;times=1")
    (error,) = embed()
    assert error.type == "error" and error.code == "content_filter" and not error.retryable
    assert error.retried == () and "self-harm" in error.message
    assert error.as_dict()["message"] == error.message  # the provider's reason, for the user


@pytest.mark.django_db(transaction=True)
def test_v1_embeddings_answer_after_a_500_once_and_say_the_retry(asgi_server, alice_key, embed_sim):
    embedder(embed_sim, "500;times=1")
    status, body = post(asgi_server, alice_key, {"model": "embedder", "input": TEXTS})
    assert status == 200, body
    assert [item["index"] for item in body["data"]] == [0, 1] and body["model"] == "embedder"
    rows = RequestLog.objects.filter(api=RequestLog.Api.EMBEDDINGS)
    assert wait_until(lambda: rows.exists(), timeout=10)
    (row,) = rows
    assert (row.status, row.target, row.retries, row.retry_causes) == (
        "complete",
        "embedder",
        1,
        "server_error",
    )


@pytest.mark.django_db(transaction=True)
def test_v1_embeddings_refused_with_a_400_are_a_400_not_retried(asgi_server, alice_key, embed_sim):
    embedder(embed_sim, "content-filter;reason=self-harm;times=1")
    status, body = post(asgi_server, alice_key, {"model": "embedder", "input": TEXTS})
    assert status == 400, body
    assert body["error"]["code"] == "content_filter" and "self-harm" in body["error"]["message"]


def post(asgi_server, key, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{asgi_server}/v1/embeddings",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --- completions: the chat pipeline's chain, its retries with it ----------------------------------


def test_a_completion_after_a_500_once_is_answered_by_the_same_endpoint(own_sim, external_sim):
    flaky = endpoint("flaky", own_sim, extra_headers={"X-Sim-Fail": "500;times=1"})
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", flaky, spare, is_default=True, use_kb_context=False)
    events = complete("Once upon a time")
    route, done = events[0], events[-1]
    assert (route.target, done.type, done.fell_back_from) == ("flaky", "done", ())
    assert [(where, kind) for where, kind, _ in done.retried] == [("flaky", "server_error")]
    assert "".join(e.text for e in events if e.type == "token")


def test_a_completion_refused_with_a_400_is_not_retried(own_sim, external_sim):
    strict = endpoint(
        "strict", own_sim, extra_headers={"X-Sim-Fail": "content-filter;times=1"}, retries=2
    )
    spare = endpoint("spare", external_sim, kind="external")
    rule("default", strict, spare, is_default=True, use_kb_context=False)
    (error,) = complete("Once upon a time")
    assert error.code == "content_filter" and error.retried == () and error.fell_back_from == ()
