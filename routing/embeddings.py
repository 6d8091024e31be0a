"""/v1/embeddings, beside chat: the vectors of a text or of token ids.

It yields the pipeline's events (`routing.events`), so the interfaces, the request log and the
metrics read them as they read a chat answer's: `route`, the vectors (`Vectors`), then `done`; or
an `error`.

Embeddings go to the endpoint the client names, where a rule that admits the caller lists it (what
/v1/models shows), or to the knowledge base's own embedding model (`auto`, or its name on
/v1/models), run in this process off the event loop. Either is counted against the caller's
limits.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from django.conf import settings

from inference_ops import engine_state, openai_fields
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.exceptions import EngineError
from inference_ops.other_apis import Embeddings, create_embeddings
from knowledge.embedding import QUERY, aembed_query, embed_texts, spec_of
from knowledge.exceptions import EmbeddingError
from knowledge.models import EmbeddingModel
from knowledge.selectors import aserving_model
from routing import breaker, replicas
from routing.attempt import ms
from routing.compiled import Snapshot, Target
from routing.events import Done, Error, Event, RouteRequest, route_event
from routing.failures import (
    Attempts,
    content_filtered,
    engine_failed,
    engine_too_long,
    retry_wait,
    unserved_error,
)
from routing.pipeline import budget_spent_error, spend_of
from routing.plan import Plan
from routing.rules import asnapshot
from routing.screening import personal_data_in
from routing.spending import reserve
from spend import ledger
from spend.prices import FREE

EMBEDDINGS = "embeddings"
# The knowledge base's embedding model on /v1/models: `kb:` and its name, which no endpoint's name
# (a slug) can be. A switch of the KB's model changes the name, so a client that keeps vectors
# sees the change instead of mixing two models' vectors.
KB_PREFIX = "kb:"

_rng = random.Random()  # noqa: S311 - a weighted pick of targets, not a secret


@dataclass(kw_only=True)
class Vectors(Event):
    """The embeddings, one per input in order: floats, or a base64 string as the engine encoded
    it (encoding_format base64)."""

    vectors: list
    type: str = "vectors"


@dataclass(frozen=True)
class EmbeddingAsk:
    """What an embeddings request asks: its input as sent, and the texts in it (None for token
    ids)."""

    input: str | list
    texts: list[str] | None
    tokens: int  # their tokens: counted for token ids, estimated for texts
    encoding_format: str  # float | base64
    dimensions: int | None


def kb_model_id(model: EmbeddingModel) -> str:
    return f"{KB_PREFIX}{model.name}"


async def kb_model_name() -> str | None:
    """The knowledge base's embedding model as /v1/models names it, when one serves."""
    model = await aserving_model()
    return kb_model_id(model) if model is not None else None


async def _personal_data_refusal(
    request: RouteRequest, ask: EmbeddingAsk, target: Target
) -> Error | None:
    """The refusal of texts holding personal data the endpoint may not receive (an external one
    that was not opted in to their types), as a chat question's; the local road takes them all."""
    if target.road == "local" or not ask.texts:
        return None
    personal = personal_data_in(ask.texts, (await asnapshot()).privacy)
    request.spent.personal_data = personal
    if not (held := [kind for kind in personal if kind not in target.personal_data]):
        if personal:
            request.spent.personal_data_action = "sent"
        return None
    request.spent.personal_data_action = "refused"
    named = ", ".join(held)
    return Error(
        code="personal_data",
        message=f"The input holds personal data ({named}) that {target.endpoint} may not "
        "receive. Embed it with a local model, or without it.",
        param="input",
        target=target.endpoint,
        road=target.road,
    )


def embedding_targets(snap: Snapshot, *, groups: frozenset[str], client: str) -> list[str]:
    """The endpoints serving embeddings this caller may name (the rules that admit it list them)."""
    return [
        name
        for name in snap.nameable(groups=groups, client=client)
        if EMBEDDINGS in snap.targets_by_model[name].apis
    ]


async def embed(
    request: RouteRequest, ask: EmbeddingAsk, *, rng: random.Random | None = None
) -> AsyncGenerator[Event, None]:
    """The embeddings of `ask`'s input by the model `request.model` names: `route`, `vectors`,
    `done`, or an `error`. A transient failure is tried again on the same endpoint as a chat
    answer's is before its first token (`_create_embeddings`); no other endpoint is asked, since
    another model's vectors are no substitute."""
    started = time.monotonic()
    found = await _embedding_target(request, ask)
    if isinstance(found, Error):
        yield found
        return
    target, model, why = found
    limited = request.passthrough.limited
    if limited and (name := openai_fields.field_refused(limited, target.kind)) is not None:
        yield Error(
            code="unsupported_parameter",
            message=openai_fields.refusal_for(name, limited[name], target.kind, target.endpoint),
            param=name,
            target=target.endpoint,
            road=target.road,
        )
        return
    if (refusal := await _personal_data_refusal(request, ask, target)) is not None:
        yield refusal
        return
    plan = Plan(
        request=request,
        text="",
        rule=None,
        targets=[target],
        started=started,
        why=why,
        named=True,
        direct=None,
        kb=None,
        max_tokens=0,
        temperature=None,
        system="",
        context="",
        citations=[],
        prompt_tokens=ask.tokens,
        fixed_tokens=ask.tokens,
    )
    specs, over_budget = await spend_of(request)
    if over_budget and target.price != FREE:
        # No over-budget rule reroutes an embedding; the gateway's own model costs nothing.
        yield budget_spent_error(specs, None)
        return
    reservation = None
    if specs:
        booked = await reserve(plan, specs)
        if isinstance(booked, Error):
            yield booked
            return
        reservation = booked
    spent = request.spent
    attempts: Attempts | None = None
    try:
        if model is not None:
            try:
                vectors: list = await _kb_vectors(model, ask)
            except EmbeddingError as exc:
                yield Error(
                    code="unavailable",
                    message=f"The knowledge base's embedding model failed: {exc}",
                    retryable=True,
                    target=target.endpoint,
                    road=target.road,
                )
                return
            used, engine_ms = ask.tokens, None
        else:
            attempts = Attempts()
            replicas.started(target.endpoint_id)
            try:
                if target.road == "local" and (
                    unserved := await engine_state.unserved(
                        target.endpoint_id, wait=target.config.first_token_timeout
                    )
                ):
                    yield unserved_error(plan, target, unserved)
                    return
                if not await breaker.allow(target.endpoint):
                    attempts.skipped(target, "circuit open or resting after a Retry-After")
                    yield await attempts.error(plan)
                    return
                result = await _create_embeddings(request, ask, target, attempts, rng or _rng)
            except EngineError as exc:
                # One vote per request for the breaker, however many tries it took.
                await engine_failed(target, exc)
                yield await _embeddings_error(plan, target, attempts, exc)
                return
            finally:
                replicas.ended(target.endpoint_id)
            await breaker.success(target.endpoint)
            vectors = result.vectors
            used = result.prompt_tokens if result.prompt_tokens is not None else ask.tokens
            engine_ms = ms(result.seconds)
        spent.prompt_tokens, spent.completion_tokens = used, 0
        spent.cost = target.price.cost(used, 0, (engine_ms or 0.0) / 1000)
        yield route_event(
            target,
            None,
            why,
            [],
            0,
            named=True,
            engine_ms=engine_ms or 0.0,
            standing=reservation.standing if reservation else None,
            retries=attempts.retry_notes() if attempts and attempts.retried else "",
        )
        yield Vectors(vectors=vectors)
        yield Done(
            road=target.road,
            rule=None,
            target=target.endpoint,
            ttft_ms=None,
            latency_ms=ms(time.monotonic() - started),
            usage={"prompt_tokens": used, "total_tokens": used},
            finish_reason="stop",
            citations=[],
            engine_ms=engine_ms,
            retried=tuple(attempts.retried) if attempts else (),
        )
    finally:
        if reservation is not None:
            ledger.settle_soon(reservation, tokens=spent.prompt_tokens or 0, cost=spent.cost or 0.0)


async def _create_embeddings(
    request: RouteRequest,
    ask: EmbeddingAsk,
    target: Target,
    attempts: Attempts,
    rng: random.Random,
) -> Embeddings:
    """The endpoint's embeddings, with the retries of a chat answer before its first token
    (`failures.retry_wait`: the endpoint's `retries`, a jittered backoff or its Retry-After, all
    within its first-token timeout); each retry noted in `attempts`. Raises the last failure."""
    first_try = time.monotonic()
    while True:
        try:
            return await create_embeddings(
                target.config,
                ask.input,
                encoding_format=ask.encoding_format,
                fields=request.passthrough.fields,
            )
        except EngineError as exc:
            wait = retry_wait(target, exc, len(attempts.retried) + 1, first_try, rng)
            if wait is None:
                raise
            attempts.retry(target, exc, wait)
            await asyncio.sleep(wait)


async def _embeddings_error(
    plan: Plan, target: Target, attempts: Attempts, exc: EngineError
) -> Error:
    """What the caller gets when the endpoint did not answer: a content-policy refusal with the
    provider's reason and an input too long for the model as the request's own fault, as for chat;
    else the failure, with its tries."""
    if exc.kind == "content_filter":
        return content_filtered(plan, target, attempts, exc)
    if exc.kind == "context_length":
        return engine_too_long(plan, target, exc)
    attempts.failed(target, exc, len(attempts.retried) + 1)
    return await attempts.error(plan)


async def _embedding_target(
    request: RouteRequest, ask: EmbeddingAsk
) -> tuple[Target, EmbeddingModel | None, str] | Error:
    """(the target, the KB's model when it is the one, why), or the refusal."""
    asked = request.model or "auto"
    if asked == "auto" or asked.startswith(KB_PREFIX):
        model = await aserving_model()
        if model is None or (asked != "auto" and asked != kb_model_id(model)):
            serving = f"; it is {kb_model_id(model)}" if model is not None else ""
            return Error(
                code="unknown_model",
                message=f"No embedding model {asked!r} serves the knowledge base{serving}.",
            )
        name = kb_model_id(model)
        if ask.texts is None:
            return Error(
                code="unsupported_parameter",
                message=f"{name} embeds text: send `input` as a string or a list of strings, not "
                "token ids (which are another model's tokens).",
                param="input",
            )
        if ask.dimensions is not None and ask.dimensions != model.dimensions:
            return Error(
                code="unsupported_parameter",
                message=f"{name} has {model.dimensions} dimensions and no shorter ones (it is no "
                "Matryoshka model): leave `dimensions` out or send its own.",
                param="dimensions",
            )
        own = Target(
            endpoint_id=0,
            endpoint=name,
            road="local",  # the gateway's own CPU: no engine, no price
            position=1,
            weight=1,
            config=EndpointConfig(name=name, base_url="", model=model.name),
            context_window=settings.ROUTING_MAX_INPUT_CHARS,
            price=FREE,
            kind=openai_fields.KB,
            apis=frozenset({EMBEDDINGS}),
        )
        return own, model, "the knowledge base's embedding model"
    snap = await asnapshot()
    target = snap.targets_by_model.get(asked)
    if target is None:
        return Error(code="unknown_model", message=f"No model named {asked!r}; see /v1/models.")
    if EMBEDDINGS not in target.apis:
        return Error(
            code="unsupported_api",
            message=f"{asked} serves {', '.join(sorted(target.apis))}, not embeddings.",
            param="model",
        )
    if asked not in embedding_targets(snap, groups=request.groups, client=request.client):
        return Error(
            code="model_not_allowed",
            message=f"No routing rule for this caller lists {asked!r}; see /v1/models.",
        )
    return target, None, f"model {asked} requested"


async def _kb_vectors(model: EmbeddingModel, ask: EmbeddingAsk) -> list[list[float]]:
    """The knowledge base's vectors of the texts, as it embeds a question (role `query`, which
    E5's authors advise for both sides of a symmetric comparison). A short single text is embedded
    as a question is, micro-batched with the questions of the moment and kept in their cache;
    a list goes to the model in one call, in a thread."""
    spec = spec_of(model)
    texts = ask.texts or []
    if len(texts) == 1 and len(texts[0]) <= settings.KB_QUERY_EMBED_CHARS:
        return [list(await aembed_query(spec, texts[0]))]
    return await asyncio.to_thread(embed_texts, spec, texts, QUERY)
