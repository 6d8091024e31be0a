"""The direct answer's second stage: a cross-encoder reranker that reads the question and each
candidate phrasing together.

The vector road compares two vectors made apart, and no threshold on their cosine separates
"cancel my order" from "cancel my subscription": both embed close to either question. A
cross-encoder reads the two texts at once and scores the pair, so the word that differs counts.
It is served the way vLLM serves rerankers (`vllm serve BAAI/bge-reranker-v2-m3`: the Jina/Cohere
shaped POST /rerank) at KB_RERANK_BASE_URL, and is off while that is empty.

When it is on, a question whose best vector score reaches KB_RERANK_FLOOR, and which the vector
road's guards did not refuse, goes to the reranker with the best phrasing of each of its top
KB_RERANK_CANDIDATES matches. The reranker's choice replaces the vector threshold and margin: its
top document must score KB_RERANK_MIN_SCORE and lead the second by KB_RERANK_MARGIN. A reranker
that fails or is late gives no direct answer, and the question goes on to generation: a wrong
curated answer costs more than a generated one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import threading
from dataclasses import dataclass

import openai
from django.conf import settings

from core.key_env import key_env_problem
from core.loops import PerLoop
from knowledge.guards import near_miss
from knowledge.verdict import DirectAnswer, Match, guards_refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankConfig:
    base_url: str
    model: str
    api_key_env: str
    timeout: float  # seconds for the whole call
    candidates: int
    min_score: float
    margin: float
    floor: float


def rerank_config() -> RerankConfig | None:
    """The reranker the settings name, or None when there is none."""
    if not settings.KB_RERANK_BASE_URL:
        return None
    return RerankConfig(
        base_url=settings.KB_RERANK_BASE_URL,
        model=settings.KB_RERANK_MODEL,
        api_key_env=settings.KB_RERANK_API_KEY_ENV,
        timeout=settings.KB_RERANK_TIMEOUT,
        candidates=settings.KB_RERANK_CANDIDATES,
        min_score=settings.KB_RERANK_MIN_SCORE,
        margin=settings.KB_RERANK_MARGIN,
        floor=settings.KB_RERANK_FLOOR,
    )


async def arerank_verdict(text: str, matches: list[Match], verdict: DirectAnswer) -> DirectAnswer:
    """The vector road's `verdict` on `text` and its `matches`, decided again by the reranker when
    one is configured and the question is for it; else `verdict` itself, at no cost. Never raises:
    a reranker that fails or is late makes a verdict without a direct answer."""
    config = rerank_config()
    if config is None or (candidates := _candidates(text, matches, verdict, config)) is None:
        return verdict
    try:
        # The SDK's timeout bounds each phase of the request; this bounds the whole of it.
        async with asyncio.timeout(config.timeout):
            data = await _async_client(config).post(
                "/rerank", body=_body(config, text, candidates), cast_to=object
            )
        scores = _scores(data, len(candidates))
    except Exception as exc:  # noqa: BLE001 - the second stage failing must never fail the question
        return _failed(verdict, config, exc)
    return _decide(text, verdict, candidates, scores, config)


def rerank_verdict(text: str, matches: list[Match], verdict: DirectAnswer) -> DirectAnswer:
    """arerank_verdict for sync callers (the KB API's answer view). The SDK's timeout bounds each
    phase of the request, not the whole."""
    config = rerank_config()
    if config is None or (candidates := _candidates(text, matches, verdict, config)) is None:
        return verdict
    try:
        data = _sync_client(config).post(
            "/rerank", body=_body(config, text, candidates), cast_to=object
        )
        scores = _scores(data, len(candidates))
    except Exception as exc:  # noqa: BLE001 - the second stage failing must never fail the question
        return _failed(verdict, config, exc)
    return _decide(text, verdict, candidates, scores, config)


def _candidates(
    text: str, matches: list[Match], verdict: DirectAnswer, config: RerankConfig
) -> list[Match] | None:
    """The matches to show the reranker, or None when the vector road's verdict stands: no match,
    a best score under the floor, or a refusal by the guards."""
    if verdict.method != "vector" or not matches or matches[0].score < config.floor:
        return None
    # A hit has passed the guards already; a refusal by them (or by the entry's own threshold, a
    # curator's bar for that entry) stands whatever the reranker would say.
    if not verdict.hit and guards_refusal(text, matches):
        return None
    return matches[: config.candidates]


def _body(config: RerankConfig, text: str, candidates: list[Match]) -> dict:
    return {
        "model": config.model,
        "query": text,
        "documents": [match.phrasing or match.entry.question for match in candidates],
    }


class _Malformed(ValueError):
    pass


def _scores(data, count: int) -> list[float]:
    """Each document's relevance, by its index, from a /rerank response; _Malformed when the
    response is not one for these `count` documents."""
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise _Malformed(f"no results list in {str(data)[:100]!r}")
    scores: list[float | None] = [None] * count
    for result in results:
        index = result.get("index") if isinstance(result, dict) else None
        score = result.get("relevance_score") if isinstance(result, dict) else None
        if type(index) is not int or not 0 <= index < count or scores[index] is not None:
            raise _Malformed(f"a result for document {index!r} of {count}")
        if type(score) not in (int, float) or not math.isfinite(score):  # type: ignore[arg-type]  # a number: its type is checked first
            raise _Malformed(f"relevance_score {score!r}")
        scores[index] = float(score)  # type: ignore[arg-type]  # a number: checked above
    if None in scores:
        raise _Malformed(f"{scores.count(None)} of {count} documents without a score")
    return scores  # type: ignore[return-value]  # None is not in scores


def _decide(
    text: str,
    verdict: DirectAnswer,
    candidates: list[Match],
    scores: list[float],
    config: RerankConfig,
) -> DirectAnswer:
    # A stable sort: on a tie the vector's order decides.
    order = sorted(range(len(candidates)), key=scores.__getitem__, reverse=True)
    top, top_score = candidates[order[0]], scores[order[0]]
    second = candidates[order[1]] if len(order) > 1 else None
    lead = top_score - (scores[order[1]] if second else 0.0)
    said = f"the reranker scores KB#{top.entry.pk} {top_score:.3f}"
    if second is not None:
        said += f", KB#{second.entry.pk} {scores[order[1]]:.3f}"
    if top_score < config.min_score:
        hit, reason = False, f"{said}: below its minimum {config.min_score:.3f}"
    elif lead < config.margin:
        hit, reason = False, f"{said}: too close (lead {lead:.3f} < {config.margin:.3f})"
    elif top is not candidates[0] and (why := near_miss(text, top.phrasing or top.entry.question)):
        # The guards ran on the vector's best; the reranker chose another entry.
        hit, reason = False, f"{said}: a near miss of KB#{top.entry.pk}: {why}"
    else:
        hit, reason = (
            True,
            (
                f"{said}: ≥ {config.min_score:.3f} and {lead:.3f} ahead "
                f"(vector score {top.score:.3f})"
            ),
        )
    return dataclasses.replace(
        verdict,
        hit=hit,
        method="rerank",
        reason=reason,
        entry=top.entry,
        score=top_score,
        runner_up=second,
        threshold=config.min_score,
        margin=lead,
    )


def _failed(verdict: DirectAnswer, config: RerankConfig, exc: Exception) -> DirectAnswer:
    if isinstance(exc, (TimeoutError, openai.APITimeoutError)):
        what = f"no answer within {config.timeout:g}s"
    else:
        what = f"{type(exc).__name__}: {str(exc)[:200]}"
    log.warning("KB reranker %s failed (%s): no direct answer", config.base_url, what)
    return dataclasses.replace(
        verdict,
        hit=False,
        method="rerank",
        reason=f"the reranker failed ({what}): no direct answer without it",
    )


def _api_key(config: RerankConfig) -> str:
    if problem := key_env_problem(config.api_key_env):
        # Checked as the embedding client does: the key leaves for the reranker's URL.
        log.error("KB reranker %s: %s Sending no key.", config.base_url, problem)
        return ""
    return os.environ.get(config.api_key_env, "") if config.api_key_env else ""


# No retries: the question waits for the reranker, and a miss only means a generated answer.
def _client_options(config: RerankConfig) -> dict:
    return dict(
        base_url=config.base_url,
        api_key=_api_key(config) or "EMPTY",
        timeout=config.timeout,
        max_retries=0,
    )


# Connections belong to the event loop that opened them: one pooled client per (loop, reranker).
_async_clients: PerLoop[openai.AsyncOpenAI] = PerLoop()
_sync_clients: dict[RerankConfig, openai.OpenAI] = {}
_sync_lock = threading.Lock()


def _async_client(config: RerankConfig) -> openai.AsyncOpenAI:
    # The SDK's aiohttp transport, as inference_ops.client uses: one HTTP stack for the async calls.
    return _async_clients.get(
        lambda: openai.AsyncOpenAI(
            **_client_options(config),
            http_client=openai.DefaultAioHttpClient(timeout=config.timeout),
        ),
        config,
    )


async def arerank_close() -> None:
    """Close the running loop's client of the configured reranker, for a command or test that
    ends its loop (the gateway's lives as long as the process)."""
    config = rerank_config()
    client = _async_clients.peek(config) if config is not None else None
    if client is not None:
        await client.close()


def _sync_client(config: RerankConfig) -> openai.OpenAI:
    with _sync_lock:
        if config not in _sync_clients:
            _sync_clients[config] = openai.OpenAI(**_client_options(config))
        return _sync_clients[config]
