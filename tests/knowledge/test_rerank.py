"""The direct answer's second stage: a cross-encoder reranker over real HTTP (the vLLM simulator
serving BAAI/bge-reranker-v2-m3), on a real KB in PostgreSQL with the real local embedding model.

The simulator's relevance reads words only (inference_ops.simulator.scoring), so the questions
are ones where the words tell the entries apart and the vectors do not."""

import asyncio
import logging
import threading

import pytest
from aiohttp import web
from asgiref.sync import async_to_sync

from knowledge.rerank import arerank_close, arerank_verdict
from knowledge.selectors import adirect_answer, direct_answer, serving_model
from knowledge.services.entries import entry_create
from knowledge.verdict import Match, vector_verdict
from tests.inference_ops.simulator_process import start_simulator

pytestmark = pytest.mark.django_db

RERANKER = "BAAI/bge-reranker-v2-m3"


def ask(text):
    """adirect_answer from a sync test: its statements share the test's transaction."""
    return async_to_sync(_closing(adirect_answer))(text)


def _closing(call):
    # Each async_to_sync call runs on a loop of its own: the reranker client it opened goes with it.
    async def run(*args):
        try:
            return await call(*args)
        finally:
            await arerank_close()

    return run


@pytest.fixture(scope="module")
def reranker():
    sim = start_simulator("serve", RERANKER, "--time-to-first-token", "1")
    yield sim
    sim.stop()


@pytest.fixture
def rerank_on(settings, reranker):
    # The vector road's operating point pinned, so each test's premise does not move with the
    # embedding model's calibrated default.
    settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN = 0.80, 0.04
    settings.KB_RERANK_BASE_URL, settings.KB_RERANK_MODEL = reranker.url, RERANKER
    return settings


def vector_only(settings, text):
    """The verdict of the vector road alone, for a test's premise."""
    url, settings.KB_RERANK_BASE_URL = settings.KB_RERANK_BASE_URL, ""
    try:
        return ask(text)
    finally:
        settings.KB_RERANK_BASE_URL = url


@pytest.mark.parametrize(
    ("question", "wrong"),
    [
        ("How do I reset my router?", "How do I reset my password?"),
        ("如何修改订单", "如何取消订单？"),  # "modify an order" is not "cancel an order"
    ],
)
def test_the_reranker_turns_a_near_miss_the_vector_road_answers_into_no_answer(
    kb, rerank_on, question, wrong
):
    alone = vector_only(rerank_on, question)
    assert alone.hit and alone.entry == kb[wrong], (
        alone.reason
    )  # the premise: vectors alone answer wrongly

    verdict = ask(question)
    assert not verdict.hit
    assert verdict.method == "rerank"
    assert verdict.reason.startswith(f"the reranker scores KB#{kb[wrong].pk} ")
    assert "below its minimum 0.500" in verdict.reason
    assert verdict.score < 0.5 and verdict.threshold == 0.5
    assert verdict.vector is not None  # the rest of the request still has the question's vector


@pytest.mark.parametrize("question", ["I want to cancel my subscription", "cancel subscription"])
def test_the_reranker_answers_a_paraphrase_the_vector_threshold_alone_would_not(
    kb, rerank_on, question
):
    rerank_on.KB_DIRECT_THRESHOLD = 0.97
    alone = vector_only(rerank_on, question)
    assert not alone.hit and "below the threshold 0.970" in alone.reason

    verdict = ask(question)
    assert verdict.hit, verdict.reason
    assert verdict.method == "rerank"
    assert verdict.entry == kb["How do I cancel my subscription?"]
    assert verdict.score >= 0.5 and verdict.margin >= 0.1
    assert verdict.runner_up is not None and verdict.runner_up.entry != verdict.entry
    assert "≥ 0.500 and" in verdict.reason and "vector score" in verdict.reason


def test_the_reranker_refuses_when_its_top_two_are_too_close(kb, rerank_on):
    rerank_on.KB_RERANK_MARGIN = 0.95
    verdict = ask("I forgot my password")
    assert not verdict.hit and verdict.method == "rerank"
    assert "too close" in verdict.reason and "< 0.950" in verdict.reason


def test_a_near_miss_refused_by_the_guards_stays_refused_without_asking_the_reranker(rerank_on):
    # The simulated reranker reads only words, and these share all but one: asked, it would answer.
    entry_create(
        question="How do I turn on notifications?", answer="Settings → Notifications.", embed="sync"
    )
    alone = vector_only(rerank_on, "How do I turn off notifications?")
    assert not alone.hit and "a near miss of KB#" in alone.reason

    verdict = ask("How do I turn off notifications?")
    assert not verdict.hit
    assert (verdict.method, verdict.reason) == ("vector", alone.reason)


def test_a_question_under_the_floor_keeps_the_vector_verdict(kb, rerank_on):
    rerank_on.KB_RERANK_FLOOR = 0.999
    alone = vector_only(rerank_on, "I forgot my password")
    verdict = ask("I forgot my password")
    assert verdict.hit and verdict.method == "vector"
    assert verdict.reason == alone.reason


def test_without_a_reranker_every_verdict_is_the_vector_roads_own(kb, settings):
    assert not settings.KB_RERANK_BASE_URL  # off by default
    model = serving_model()
    for question in [
        "How do I reset my router?",
        "I want to cancel my subscription",
        "I forgot my password",
        "如何修改订单",
        "what is the weather today",
    ]:
        verdict = ask(question)
        first = vector_verdict(
            question, verdict.matches, threshold=model.threshold, margin=model.margin
        )
        assert verdict.method == "vector"
        assert (verdict.hit, verdict.reason, verdict.entry, verdict.score) == (
            first.hit,
            first.reason,
            first.entry,
            first.score,
        )


def test_the_sync_direct_answer_takes_the_second_stage_too(kb, rerank_on):
    near_miss = direct_answer("How do I reset my router?")
    assert not near_miss.hit and near_miss.method == "rerank"
    paraphrase = direct_answer("I forgot my password")
    assert paraphrase.hit and paraphrase.method == "rerank"
    assert paraphrase.entry == kb["How do I reset my password?"]


# -- a reranker that fails ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def flaky_reranker():
    """Every request gets a fault: a dropped connection, a hang, a 500, a 429, ..."""
    sim = start_simulator(
        "serve",
        RERANKER,
        "--failure-injection-rate",
        "1",
        "--seed",
        "5",
        "--time-to-first-token",
        "1",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def slow_reranker():
    sim = start_simulator("serve", RERANKER, "--time-to-first-token", "5000")
    yield sim
    sim.stop()


def test_a_failing_reranker_gives_no_direct_answer_and_no_exception(
    kb, rerank_on, flaky_reranker, caplog
):
    rerank_on.KB_RERANK_BASE_URL, rerank_on.KB_RERANK_TIMEOUT = flaky_reranker.url, 0.5
    with caplog.at_level(logging.WARNING, logger="knowledge.rerank"):
        verdicts = [ask("I forgot my password") for _ in range(6)]
    assert all(not v.hit and v.method == "rerank" for v in verdicts)
    assert all(v.reason.startswith("the reranker failed (") for v in verdicts)
    assert all(v.reason.endswith("): no direct answer without it") for v in verdicts)
    assert sum("KB reranker" in r.message and "failed" in r.message for r in caplog.records) == 6
    assert any("injecting fault" in line for line in flaky_reranker.output)


def test_a_slow_reranker_is_cut_off_at_its_timeout(kb, rerank_on, slow_reranker):
    rerank_on.KB_RERANK_BASE_URL, rerank_on.KB_RERANK_TIMEOUT = slow_reranker.url, 0.2
    verdict = ask("I forgot my password")
    assert not verdict.hit and verdict.method == "rerank"
    assert "no answer within 0.2s" in verdict.reason
    assert not direct_answer("I forgot my password").hit  # the sync road too


def test_a_reranker_that_is_not_one_or_serves_another_model_is_a_failure(kb, rerank_on, local_sim):
    rerank_on.KB_RERANK_MODEL = "nope"
    verdict = ask("I forgot my password")
    assert (
        not verdict.hit
        and "NotFoundError" in verdict.reason
        and "`nope` does not exist" in verdict.reason
    )

    rerank_on.KB_RERANK_BASE_URL, rerank_on.KB_RERANK_MODEL = local_sim.url, "acme/local"
    verdict = ask("I forgot my password")
    # A generative model has no /rerank route (vLLM 0.32 registers its runner's routes only).
    assert not verdict.hit and "NotFoundError" in verdict.reason


# A real HTTP server answering /rerank with what a broken reranker might send, the model asked for
# picking the body; or, for the model `prefer:WORDS`, a reranker sure of the documents with WORDS.
ODD_BODIES = {
    "text": "all good",
    "no-results": {"data": []},
    "too-few": {"results": [{"index": 0, "relevance_score": 0.9}]},
    "index-out-of-range": {"results": [{"index": i, "relevance_score": 0.9} for i in range(1, 9)]},
    "index-twice": {"results": [{"index": 0, "relevance_score": 0.9}] * 5},
    "score-as-text": {"results": [{"index": i, "relevance_score": "high"} for i in range(5)]},
    "score-not-finite": {
        "results": [{"index": i, "relevance_score": float("nan")} for i in range(5)]
    },
    "index-as-bool": {"results": [{"index": True, "relevance_score": 0.9}]},
}


@pytest.fixture(scope="module")
def odd_reranker():
    async def rerank(request: web.Request) -> web.Response:
        asked = await request.json()
        if asked["model"].startswith("prefer:"):
            words = asked["model"].removeprefix("prefer:")
            return web.json_response(
                {
                    "results": [
                        {"index": i, "relevance_score": 0.99 if words in document else 0.01}
                        for i, document in enumerate(asked["documents"])
                    ]
                }
            )
        body = ODD_BODIES[asked["model"]]
        if isinstance(body, str):
            return web.Response(text=body)
        return web.json_response(body)  # json.dumps writes NaN as it is

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/rerank", rerank)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@pytest.mark.parametrize("body", sorted(ODD_BODIES))
def test_a_malformed_rerank_response_is_a_failure_not_a_crash(kb, rerank_on, odd_reranker, body):
    rerank_on.KB_RERANK_BASE_URL, rerank_on.KB_RERANK_MODEL = odd_reranker, body
    verdict = ask("I forgot my password")
    assert not verdict.hit and verdict.method == "rerank"
    assert verdict.reason.startswith("the reranker failed (_Malformed: ")


def test_the_near_miss_guard_overrules_a_reranker_that_picks_the_opposite_action(
    rerank_on, odd_reranker
):
    question = "How do I turn off notifications?"
    entries = [
        entry_create(question=text, answer="…", embed="none")
        for text in (
            "How can I mute alerts?",
            "What are your opening hours?",
            "How do I turn on notifications?",
        )
    ]
    matches = [
        Match(entry=entry, score=score, phrasing=entry.question, texts=(entry.question,))
        for entry, score in zip(entries, (0.95, 0.90, 0.88))
    ]
    verdict = vector_verdict(question, matches, threshold=0.8, margin=0.01)
    assert (
        verdict.hit and verdict.entry == entries[0]
    )  # the premise: the guards let the best through

    rerank_on.KB_RERANK_BASE_URL, rerank_on.KB_RERANK_MODEL = odd_reranker, "prefer:turn on"
    reranked = async_to_sync(_closing(arerank_verdict))(question, matches, verdict)
    assert not reranked.hit and reranked.entry == entries[2]
    assert (
        f"a near miss of KB#{entries[2].pk}: it asks 'off' where the entry says 'on'"
        in reranked.reason
    )


def test_a_key_variable_the_policy_refuses_is_never_sent(kb, rerank_on, caplog):
    rerank_on.KB_RERANK_API_KEY_ENV = "SECRET_KEY"
    with caplog.at_level(logging.ERROR, logger="knowledge.rerank"):
        verdict = ask("I forgot my password")
    assert verdict.hit and verdict.method == "rerank"  # asked without a key
    assert any("SECRET_KEY may not hold an endpoint key" in r.message for r in caplog.records)
