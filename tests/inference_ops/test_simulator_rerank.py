"""The simulator as a reranker (vLLM's /rerank and /score), a real process over real HTTP."""

import time

import aiohttp
import openai
import pytest

from inference_ops.simulator.cli import parse_args

from .simulator_process import start_simulator
from .test_simulator import HTTP_TIMEOUT, post, sdk

QUERY = "How do I cancel my subscription?"
DOCUMENTS = [
    "What are your opening hours?",
    "How do I cancel my order?",
    "cancel my subscription plan",
]
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def reranker():
    """Started with the command line vLLM is given for a reranker, under two served names."""
    sim = start_simulator(
        "serve",
        "BAAI/bge-reranker-v2-m3",
        "--served-model-name",
        "reranker",
        "bge",
        "--max-model-len",
        "64",
        "--time-to-first-token",
        "1",
        "--dtype",
        "auto",
    )
    yield sim
    sim.stop()


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_returns_every_document_by_relevance_in_the_jina_cohere_shape(reranker, path):
    status, body = await post(
        reranker, path, {"model": "bge", "query": QUERY, "documents": DOCUMENTS}
    )
    assert status == 200
    assert set(body) == {"id", "model", "usage", "results"}
    assert body["id"].startswith("rerank-")
    assert body["model"] == "reranker"  # the primary served name, whichever alias was asked for
    assert body["usage"]["total_tokens"] > 0
    assert [r["index"] for r in body["results"]] == [2, 1, 0]
    assert [r["document"]["text"] for r in body["results"]] == [
        DOCUMENTS[2],
        DOCUMENTS[1],
        DOCUMENTS[0],
    ]
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize(("top_n", "count"), [(1, 1), (2, 2), (0, 3), (10, 3), (None, 3)])
async def test_rerank_cuts_the_results_to_top_n_when_it_is_set(reranker, top_n, count):
    request = {"query": QUERY, "documents": DOCUMENTS} | ({} if top_n is None else {"top_n": top_n})
    status, body = await post(reranker, "/rerank", request)
    assert status == 200
    assert [r["index"] for r in body["results"]] == [2, 1, 0][:count]


async def test_the_relevance_is_deterministic_and_reads_the_words_of_both_texts(reranker):
    documents = [
        QUERY,
        "How do I cancel my order?",
        "What is LoRA?",
        "如何取消订阅？",
        "如何取消订单？",
    ]
    first = await post(reranker, "/rerank", {"query": QUERY, "documents": documents})
    again = await post(reranker, "/rerank", {"query": QUERY, "documents": documents})
    chinese = await post(reranker, "/rerank", {"query": "取消订阅", "documents": documents})
    by_index = {r["index"]: r["relevance_score"] for r in first[1]["results"]}
    assert by_index == {r["index"]: r["relevance_score"] for r in again[1]["results"]}
    assert by_index[0] > 0.9  # the same question
    assert by_index[1] < 0.5  # a near miss: one long word differs
    assert by_index[2] < 0.01 and by_index[3] < 0.01  # nothing in common
    zh = {r["index"]: r["relevance_score"] for r in chinese[1]["results"]}
    assert zh[3] > 0.5 > zh[4]  # CJK by character bigrams: 订阅 is not 订单


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
async def test_score_pairs_one_text_with_many_in_vllms_shape(reranker, path):
    status, body = await post(
        reranker, path, {"model": "reranker", "text_1": QUERY, "text_2": DOCUMENTS}
    )
    assert status == 200
    assert (body["object"], body["model"]) == ("list", "reranker")
    assert body["id"].startswith("score-") and isinstance(body["created"], int)
    assert [(d["index"], d["object"]) for d in body["data"]] == [
        (0, "score"),
        (1, "score"),
        (2, "score"),
    ]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    _, reranked = await post(reranker, "/rerank", {"query": QUERY, "documents": DOCUMENTS})
    # The same pairs score the same on both routes; /score keeps the input order.
    assert [d["score"] for d in body["data"]] == [
        next(r["relevance_score"] for r in reranked["results"] if r["index"] == i) for i in range(3)
    ]


async def test_score_pairs_lists_of_the_same_length_place_by_place(reranker):
    status, body = await post(
        reranker,
        "/score",
        {"text_1": ["What is LoRA?", QUERY], "text_2": ["What is LoRA?", "What is LoRA?"]},
    )
    assert status == 200
    first, second = (d["score"] for d in body["data"])
    assert first > 0.9 > 0.01 > second


async def test_an_unknown_model_is_a_404_on_rerank_and_score(reranker):
    for path, request in [
        ("/rerank", {"model": "nope", "query": "q", "documents": ["d"]}),
        ("/score", {"model": "nope", "text_1": "q", "text_2": "d"}),
    ]:
        status, body = await post(reranker, path, request)
        assert status == 404
        assert body == {
            "error": {
                "message": "The model `nope` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/rerank", "{not json", "JSON decode error"),
        ("/rerank", ["a list"], "valid dictionary"),
        ("/rerank", {"documents": ["d"]}, "body.query"),
        ("/rerank", {"query": "q"}, "body.documents"),
        ("/rerank", {"query": 7, "documents": ["d"]}, "valid string"),
        ("/rerank", {"query": "q", "documents": "d"}, "list of strings"),
        ("/rerank", {"query": "q", "documents": ["d", 3]}, "list of strings"),
        (
            "/rerank",
            {"query": "q", "documents": []},
            "At least one text_pair element must be given",
        ),
        ("/rerank", {"query": "q", "documents": ["d"], "top_n": "2"}, "valid integer"),
        (
            "/rerank",
            {"query": "q", "documents": ["word " * 80]},
            "maximum context length is 64 tokens",
        ),
        ("/score", {"text_1": "q"}, "body.text_2"),
        (
            "/score",
            {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]},
            "Input lengths must be either 1:1, 1:N or N:N",
        ),
        ("/score", {"text_1": [], "text_2": ["a"]}, "At least one text element must be given"),
        ("/score", {"text_1": "q", "text_2": [1]}, "string or list of strings"),
        ("/score", {"text_1": "q", "text_2": "word " * 80}, "in the input for score"),
    ],
)
async def test_a_bad_body_is_vllms_400_bad_request(reranker, path, body, fragment):
    status, response = await post(reranker, path, body, headers=JSON)
    assert status == 400
    # vLLM 0.32 answers what pydantic refuses as FastAPI's RequestValidationError ("Bad Request",
    # the errors listed) and its own checks as "BadRequestError".
    pydantic = response["error"]["message"].startswith("1 validation error")
    kind = "Bad Request" if pydantic else "BadRequestError"
    assert (response["error"]["type"], response["error"]["code"]) == (kind, 400)
    assert fragment in response["error"]["message"]


async def test_a_body_that_is_not_json_by_its_content_type_is_a_400(reranker):
    status, response = await post(
        reranker,
        "/rerank",
        '{"query": "q", "documents": ["d"]}',
        headers={"Content-Type": "text/plain"},
    )
    assert status == 400 and "Only 'application/json' is allowed" in response["error"]["message"]


async def test_a_reranker_serves_no_generation_and_a_generative_model_no_rerank(
    reranker, simulator
):
    # vLLM 0.32 registers the routes of its runner only: FastAPI's 404 for the others.
    async with sdk(reranker) as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="reranker", messages=[{"role": "user", "content": "hi"}]
            )
    for path, request in [
        ("/rerank", {"query": "q", "documents": ["d"]}),
        ("/score", {"text_1": "q", "text_2": "d"}),
        ("/v1/embeddings", {"input": "q"}),
    ]:
        status, body = await post(simulator, path, request)
        assert (status, body) == (404, {"detail": "Not Found"}), path


async def test_an_embedding_model_scores_by_the_cosine_of_its_vectors():
    sim = start_simulator("serve", "acme/embed", "--embedding-dim", "64")
    try:
        status, body = await post(
            sim,
            "/score",
            {"text_1": "cancel my order", "text_2": ["cancel my order", "opening hours"]},
        )
    finally:
        sim.stop()
    assert status == 200
    same, other = (d["score"] for d in body["data"])
    assert same == pytest.approx(1.0) and other < same


@pytest.mark.parametrize(("fault", "status"), [("500", 500), ("429", 429), ("mid-stream", 500)])
async def test_a_fault_header_fails_a_rerank_like_a_generation(reranker, fault, status):
    code, body = await post(
        reranker, "/rerank", {"query": "q", "documents": ["d"]}, headers={"X-Sim-Fail": fault}
    )
    assert code == status
    assert body["error"]["code"] == status


@pytest.mark.parametrize("fault", ["connect-close", "before-first-token", "hang"])
async def test_a_connection_fault_reaches_the_client_as_a_connection_error(reranker, fault):
    async with sdk(reranker, timeout=1.0) as client:
        with pytest.raises(openai.APIConnectionError):
            await client.post(
                "/rerank",
                body={"query": "q", "documents": ["d"]},
                cast_to=object,
                options={"headers": {"X-Sim-Fail": fault}},
            )


async def test_a_rerank_takes_the_time_to_first_token():
    sim = start_simulator("serve", "acme/bge-reranker", "--time-to-first-token", "300")
    try:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            started = time.monotonic()
            async with session.post(
                f"{sim.url}/rerank", json={"query": "q", "documents": ["d"]}
            ) as response:
                assert response.status == 200
            assert time.monotonic() - started >= 0.3
    finally:
        sim.stop()


def test_a_model_named_like_a_reranker_is_a_cross_encoder_unless_told_otherwise():
    assert parse_args(["serve", "BAAI/bge-reranker-v2-m3"]).cross_encoder
    assert parse_args(["serve", "acme/scorer", "--cross-encoder"]).cross_encoder
    assert not parse_args(["serve", "Qwen/Qwen3-0.6B"]).cross_encoder
    assert not parse_args(["serve", "acme/rerank-embed", "--embedding-dim", "8"]).cross_encoder
    with pytest.raises(SystemExit):
        parse_args(["serve", "acme/x", "--cross-encoder", "--embedding-dim", "8"])
