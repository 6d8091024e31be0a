"""`POST /v1/embeddings` through the real gateway (daphne): by a vLLM pooling model (the simulator
started as vLLM starts one, `--runner pooling`) and by the knowledge base's own embedding model,
the gateway's embedded default. The clients are the official SDK (floats, base64, lists, token
ids) and LangChain's OpenAIEmbeddings, as a RAG tool uses them."""

import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from chat.models import ApiKey
from inference_ops import openai_fields
from inference_ops.models import ModelEndpoint
from knowledge.embedding import embed_texts, spec_of
from knowledge.selectors import serving_model
from observability.models import RequestLog
from spend.models import Limit
from tests.inference_ops.simulator_process import start_simulator
from tests.spend.test_limits import same_minute
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until
from tests.support.stub_engine import EMBEDDING_DIM, ApisRecorder

pytestmark = pytest.mark.django_db(transaction=True)

TEXTS = ["How do I reset my password?", "Where is the lighthouse?"]
KINDS = ("vllm", "cpu", "external")
# A valid value of every field the gateway passes on (or sends to some kinds only).
SAMPLES = {
    "dimensions": 8,
    "user": "customer-42",
    "truncate_prompt_tokens": 10,
    "truncation_side": "left",
    "add_special_tokens": False,
    "use_activation": True,
    "padding": "max_length",
    "embed_dtype": "float16",
    "endianness": "little",
    "cache_salt": "tenant-salt",
}


@pytest.fixture(scope="module")
def embed_sim():
    """A vLLM embedding model as vLLM is started for one: a pooling runner."""
    sim = start_simulator(
        "serve", "acme/embed", "--runner", "pooling", "--convert", "embed", "--embedding-dim", "64"
    )
    yield sim
    sim.stop()


@pytest.fixture
def gateway(asgi_server, alice_key, product, embed_sim):
    """The default rule lists a chat model and the embedding model: the key may name both."""
    embedder = endpoint("embedder", embed_sim, model="acme/embed", apis=["embeddings"])
    rule("embeddings", embedder, priority=1, keywords=["never-asked"], use_kb_context=False)
    return asgi_server


@pytest.fixture(scope="module")
def recorder():
    engine = ApisRecorder().start()
    yield engine
    engine.stop()


@pytest.fixture
def targets(recorder):
    """An embeddings endpoint of each kind on the recording engine, listed by the default rule."""
    made = {
        kind: endpoint(
            f"rec-{kind}",
            url=f"{recorder.url}/v1",
            kind=kind,
            model="served-name",
            apis=["embeddings"],
        )
        for kind in KINDS
    }
    rule("default", *made.values(), is_default=True, use_kb_context=False)
    recorder.received.clear()
    return made


def sdk(asgi_server, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=key, max_retries=0, timeout=60)


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


def key_row(raw: str) -> ApiKey:
    return ApiKey.objects.get(prefix=raw.split("_")[1])


def logged(key: str, count=1) -> list[RequestLog]:
    """The key's rows once `count` are in: the server writes them in batches behind the answers
    (an earlier test's may land late; they are another key's)."""
    rows = RequestLog.objects.filter(api_key_id=key_row(key).pk).order_by("at", "id")
    wait_until(lambda: rows.count() >= count, timeout=10)
    return list(rows)


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def kb_name() -> str:
    return f"kb:{serving_model().name}"


# --- what a client gets --------------------------------------------------------------------------


def test_models_list_what_each_model_serves_and_the_knowledge_bases_embedder(gateway, alice_key):
    listed = {m.id: m.apis for m in sdk(gateway, alice_key).models.list()}
    assert listed == {
        "auto": ["chat", "completions", "embeddings"],
        "embedder": ["embeddings"],
        "external": ["chat", "completions"],
        "local": ["chat", "completions"],
        kb_name(): ["embeddings"],
    }


def test_the_sdk_gets_float_and_base64_vectors_of_a_list_of_inputs(gateway, alice_key):
    client = sdk(gateway, alice_key)
    raw = client.embeddings.with_raw_response.create(
        model="embedder", input=TEXTS, encoding_format="float"
    )
    floats = raw.parse()
    # The SDK's default: base64 on the wire, which it decodes.
    decoded = client.embeddings.create(model="embedder", input=TEXTS)
    wire = client.embeddings.create(model="embedder", input=TEXTS, encoding_format="base64")
    assert [item.index for item in floats.data] == [0, 1]
    assert [len(item.embedding) for item in floats.data] == [64, 64]
    assert floats.model == "embedder" and floats.usage.prompt_tokens > 0
    assert floats.usage.total_tokens == floats.usage.prompt_tokens
    for exact, fromb64 in zip(floats.data, decoded.data, strict=True):
        assert fromb64.embedding == pytest.approx(exact.embedding, abs=1e-6)
    assert all(isinstance(item.embedding, str) for item in wire.data)
    assert raw.headers["X-Route"] == "local" and raw.headers["X-Route-Target"] == "embedder"


def test_token_ids_are_embedded_by_an_endpoint_that_takes_them(gateway, alice_key):
    response = sdk(gateway, alice_key).embeddings.create(
        model="embedder", input=[[101, 2023], [7]], encoding_format="float"
    )
    assert [len(item.embedding) for item in response.data] == [64, 64]
    assert response.usage.prompt_tokens == 3


def test_langchains_openai_embeddings_embeds_documents_and_a_query(gateway, alice_key):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        base_url=f"{gateway}/v1",
        api_key=alice_key,
        model="embedder",
        check_embedding_ctx_length=False,  # tiktoken cannot download its vocabulary here
        max_retries=0,
    )
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[0])
    assert [len(vector) for vector in documents] == [64, 64]
    assert query == pytest.approx(documents[0], abs=1e-6)
    assert cosine(documents[0], documents[1]) < 0.99


def test_the_knowledge_bases_model_is_the_embedded_default(gateway, alice_key):
    client = sdk(gateway, alice_key)
    by_name = client.embeddings.create(model=kb_name(), input=TEXTS, encoding_format="float")
    by_default = client.embeddings.create(model="auto", input=TEXTS[0])  # base64, decoded
    assert by_name.model == kb_name() and by_default.model == kb_name()
    # The vectors the knowledge base gives the same texts as questions.
    expected = embed_texts(spec_of(serving_model()), TEXTS)
    for got, want in zip(by_name.data, expected, strict=True):
        assert cosine(got.embedding, want) > 0.999
    assert cosine(by_default.data[0].embedding, expected[0]) > 0.999
    assert len(by_name.data[0].embedding) == serving_model().dimensions
    assert by_name.usage.prompt_tokens > 0


def test_the_knowledge_bases_model_refuses_token_ids_and_another_size(gateway, alice_key):
    status, ids = post(gateway, alice_key, {"model": "auto", "input": [1, 2, 3]})
    assert status == 400 and ids["error"]["param"] == "input"
    assert "token ids" in ids["error"]["message"]
    status, dims = post(gateway, alice_key, {"model": "auto", "input": "hi", "dimensions": 8})
    assert status == 400 and dims["error"]["param"] == "dimensions"
    assert f"has {serving_model().dimensions} dimensions" in dims["error"]["message"]


def test_dimensions_reach_the_endpoint_whose_refusal_comes_back_as_a_400(gateway, alice_key):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(gateway, alice_key).embeddings.create(model="embedder", input="hi", dimensions=8)
    assert caught.value.body["code"] == "request_refused"
    assert "does not support Matryoshka embeddings" in caught.value.body["message"]


def test_a_vllm_extra_is_refused_for_the_knowledge_bases_model_by_name(gateway, alice_key):
    body = {"model": "auto", "input": "hi", "truncate_prompt_tokens": 10}
    status, refused = post(gateway, alice_key, body)
    assert status == 400 and refused["error"]["param"] == "truncate_prompt_tokens"
    assert refused["error"]["code"] == "unsupported_parameter"
    status, passed = post(gateway, alice_key, {**body, "model": "embedder"})
    assert status == 200 and len(passed["data"]) == 1


# --- the fields ---------------------------------------------------------------------------------


def test_the_input_and_its_encoding_reach_the_endpoint_as_sent(
    asgi_server, alice_key, targets, recorder
):
    status, body = post(
        asgi_server,
        alice_key,
        {"model": "rec-vllm", "input": [[1, 2], [3]], "encoding_format": "base64"},
    )
    assert status == 200 and [item["index"] for item in body["data"]] == [0, 1]
    assert all(isinstance(item["embedding"], str) for item in body["data"])
    assert body["model"] == "rec-vllm" and body["usage"]["prompt_tokens"] == 6
    (sent,) = recorder.received
    assert (sent["input"], sent["encoding_format"]) == ([[1, 2], [3]], "base64")


def test_the_samples_cover_every_field_the_gateway_passes_on():
    assert set(SAMPLES) == set(openai_fields.EMBEDDING_TAKES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_field_reaches_the_engines_that_take_it_as_sent_and_is_refused_by_name_elsewhere(
    asgi_server, alice_key, targets, recorder, name
):
    value = SAMPLES[name]
    takes = openai_fields.kinds_taking(name, value, openai_fields.EMBEDDINGS)
    for kind in KINDS:
        recorder.received.clear()
        status, body = post(
            asgi_server, alice_key, {"model": f"rec-{kind}", "input": "hello", name: value}
        )
        if kind in takes:
            assert status == 200, body
            (sent,) = recorder.received
            assert (sent[name], sent["input"], sent["model"]) == (value, "hello", "served-name")
            assert len(body["data"][0]["embedding"]) == EMBEDDING_DIM
        else:
            assert status == 400, body
            error = body["error"]
            assert error["param"] == name and error["code"] == "unsupported_parameter"
            assert f"`{name}`" in error["message"] and f"rec-{kind}" in error["message"]
            assert recorder.received == []  # never sent to be ignored


def test_the_docs_table_says_each_fields_policy_as_the_code_does():
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = text.split("<!-- embedding-fields:start -->")[1]
    table = table.split("<!-- embedding-fields:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        name, policy, *marks = (cell.strip() for cell in line.strip("|").split("|"))
        rows[name.strip("`")] = (policy, dict(zip((*KINDS, "kb"), marks, strict=True)))
    assert set(rows) == set(openai_fields.EMBEDDING_KNOWN)
    for name, (policy, marks) in rows.items():
        if name in openai_fields.EMBEDDING_REFUSED:
            assert policy.startswith("refused") and set(marks.values()) == {"400"}, name
        elif name in openai_fields.EMBEDDING_GATEWAY:
            assert policy.startswith("the gateway's") and set(marks.values()) == {"✓"}, name
        else:
            takes = openai_fields.kinds_taking(name, SAMPLES[name], openai_fields.EMBEDDINGS)
            expected = {kind: "✓" if kind in takes else "400" for kind in (*KINDS, "kb")}
            assert marks == expected, name


# --- routing --------------------------------------------------------------------------------------


def test_an_endpoint_no_rule_of_the_caller_lists_is_a_403(gateway, alice_key, embed_sim):
    endpoint("hidden", embed_sim, model="acme/embed", apis=["embeddings"])
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk(gateway, alice_key).embeddings.create(model="hidden", input="hi")
    assert caught.value.body["code"] == "model_not_allowed"


def test_a_chat_model_serves_no_embeddings_and_an_unknown_one_none_at_all(gateway, alice_key):
    client = sdk(gateway, alice_key)
    with pytest.raises(openai.BadRequestError) as chat_model:
        client.embeddings.create(model="local", input="hi")
    assert chat_model.value.body["code"] == "unsupported_api"
    assert chat_model.value.body["message"] == "local serves chat, completions, not embeddings."
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="kb:another-model", input="hi")
    assert unknown.value.body["code"] == "model_not_found"


def test_chat_passes_over_an_endpoint_that_serves_embeddings_only(
    asgi_server, alice_key, local_sim, embed_sim
):
    embedder = endpoint("embedder", embed_sim, model="acme/embed", apis=["embeddings"])
    local = endpoint("local", local_sim)
    rule("default", embedder, local, is_default=True, use_kb_context=False)
    raw = sdk(asgi_server, alice_key).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=3
    )
    assert raw.headers["X-Route-Target"] == "local" and raw.parse().choices[0].message.content


def test_an_endpoint_that_is_down_is_a_503(gateway, alice_key):
    down = endpoint("down", url="http://127.0.0.1:1/v1", apis=["embeddings"])
    rule("down", down, priority=2, keywords=["never-asked"], use_kb_context=False)
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(gateway, alice_key).embeddings.create(model="down", input="hi")
    assert caught.value.status_code == 503 and caught.value.body["code"] == "connect"


# --- bad input and limits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "embedder"}, "input", None),
        ({"model": "embedder", "input": ""}, "input", None),
        ({"model": "embedder", "input": []}, "input", None),
        ({"model": "embedder", "input": ["a", ""]}, "input[1]", None),
        ({"model": "embedder", "input": ["a", 1]}, "input", None),
        ({"model": "embedder", "input": [[1], []]}, "input", None),
        ({"model": "embedder", "input": {"text": "a"}}, "input", None),
        ({"model": "embedder", "input": "nul\x00"}, "input", "invalid_text"),
        ({"input": "a"}, "model", None),
        ({"model": "embedder", "input": "a", "encoding_format": "bytes"}, "encoding_format", None),
        ({"model": "embedder", "input": "a", "dimensions": 0}, "dimensions", None),
        ({"model": "embedder", "input": "a", "priority": 1}, "priority", "unsupported_parameter"),
        ({"model": "embedder", "input": "a", "texts": ["a"]}, "texts", "unknown_parameter"),
    ],
)
def test_bad_input_is_a_400_that_names_the_field(gateway, alice_key, body, param, code):
    status, reply = post(gateway, alice_key, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    if code is not None:
        assert reply["error"]["code"] == code


def test_an_input_too_large_is_a_413_and_too_many_inputs_a_400(gateway, alice_key):
    status, large = post(gateway, alice_key, {"model": "embedder", "input": ["a", "x" * 32001]})
    assert status == 413 and large["error"]["code"] == "input_too_large"
    assert large["error"]["param"] == "input[1]"
    assert "the limit is 32000" in large["error"]["message"]
    status, many = post(gateway, alice_key, {"model": "embedder", "input": ["a"] * 257})
    assert status == 400 and many["error"]["code"] == "too_many_inputs"
    assert "at most 256" in many["error"]["message"]


def test_a_spend_limit_refuses_embeddings_with_a_429(gateway, alice_key):
    Limit.objects.create(api_key=key_row(alice_key), requests_per_minute=1)
    same_minute()
    client = sdk(gateway, alice_key)
    first = client.embeddings.with_raw_response.create(model="embedder", input="hi")
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as caught:
        client.embeddings.create(model=kb_name(), input="hi")
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert 1 <= int(caught.value.response.headers["Retry-After"]) <= 60


def test_the_request_log_keeps_a_row_per_call_with_its_api_and_tokens(gateway, alice, alice_key):
    client = sdk(gateway, alice_key)
    by_endpoint = client.embeddings.create(model="embedder", input=TEXTS)
    by_kb = client.embeddings.create(model="auto", input=TEXTS[0])
    rows = logged(alice_key, count=2)
    assert [(r.interface, r.api, r.target, r.status, r.user_id) for r in rows] == [
        ("v1", "embeddings", "embedder", "complete", alice.pk),
        ("v1", "embeddings", kb_name(), "complete", alice.pk),
    ]
    assert [(r.prompt_tokens, r.completion_tokens) for r in rows] == [
        (by_endpoint.usage.prompt_tokens, 0),
        (by_kb.usage.prompt_tokens, 0),
    ]


# --- the endpoint's APIs in the admin -------------------------------------------------------------


def _endpoint_form(**fields) -> dict:
    return {
        "name": "pooling",
        "kind": "vllm",
        "active": "on",
        "base_url": "http://127.0.0.1:8010/v1",
        "model": "acme/embed",
        "context_window": "4096",
        "max_concurrency": "64",
        "connect_timeout": "3",
        "first_token_timeout": "30",
        "idle_timeout": "15",
        "total_timeout": "300",
        "retries": "2",
        "retry_base": "0.25",
        "retry_cap": "2",
        "extra_headers": "{}",
        **fields,
    }


def test_the_admin_says_which_apis_an_endpoint_may_serve(admin_client):
    add = "/admin/inference_ops/modelendpoint/add/"
    both = admin_client.post(add, _endpoint_form(apis=["chat", "embeddings"]))
    assert both.status_code == 200
    assert "A vLLM server runs one runner" in both.content.decode()
    none = admin_client.post(add, _endpoint_form())
    assert none.status_code == 200 and "This field is required" in none.content.decode()
    assert not ModelEndpoint.objects.filter(name="pooling").exists()
    saved = admin_client.post(add, _endpoint_form(apis=["embeddings"]))
    assert saved.status_code == 302
    assert ModelEndpoint.objects.get(name="pooling").apis == ["embeddings"]
    # An external API may serve them all.
    external = admin_client.post(
        add, _endpoint_form(name="hosted", kind="external", apis=["chat", "embeddings"])
    )
    assert external.status_code == 302
