"""A /v1 call that stores no chat message: a raw completion or embeddings
(routing.completions, routing.embeddings).

It is taken in as a chat question is (chat.turns: a draining process refuses it; the user's rate
limit counts it and it holds one of the user's stream slots while it runs) and leaves what a chat
turn leaves but the messages: a request-log row, with the API it called, and the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator

from chat import services
from chat.models import ApiKey
from chat.turn_record import overhead_ms, turn_log_row, turn_status
from chat.turns import turn_admit
from observability import metrics
from observability.models import RequestLog
from observability.requestlog import request_note
from routing import events


async def run_call(
    *,
    key: ApiKey,
    api: str,
    answer: AsyncGenerator[events.Event, None],
    arrived: float,
    request_key: uuid.UUID,
    spent: events.Spent,
    features: tuple[str, ...] = (),
) -> AsyncGenerator[events.Event, None]:
    """Take the call in, then yield `answer`'s events; its row is noted (and its slot given back)
    before its last event is yielded, or when it is closed or cancelled before that. Raises
    Draining or RateLimited (TooManyStreams) before anything is counted or asked."""
    try:
        turn_admit()
        slot = await services.aquestion_admit(user_id=key.user_id)
    except BaseException:
        await answer.aclose()  # never started: nothing of it runs
        raise
    metrics.request_started(RequestLog.Interface.V1)
    route: events.Route | None = None
    first_token_at: float | None = None
    produced = False
    saved = False

    async def save(final: events.Event | None, cancelled: bool) -> None:
        nonlocal saved, slot
        saved = True
        error = final if isinstance(final, events.Error) else None
        if cancelled:
            error = events.Error(code="cancelled", message="stopped before the answer finished")
        done = final if isinstance(final, events.Done) else None
        record = turn_log_row(
            arrived=arrived,
            first_token_at=first_token_at,
            interface=RequestLog.Interface.V1,
            user_id=key.user_id,
            api_key_id=key.pk,
            session_id=None,
            status=turn_status(final, cancelled, produced),
            route=route,
            done=done,
            error=error,
            key=request_key,
            spent=spent,
            features=features,
        )
        record = dataclasses.replace(record, api=api)
        request_note(record)
        metrics.request_ended(record)
        if slot is not None:
            # Shielded: the slot goes back even while this task is being cancelled.
            await asyncio.shield(services.astream_slot_release(slot=slot))
            slot = None

    try:
        async for event in answer:
            if isinstance(event, events.Token):
                if first_token_at is None:
                    first_token_at = time.monotonic()
                produced = True
            elif isinstance(event, events.Route):
                route = event
            elif isinstance(event, (events.Done, events.Error)):
                if isinstance(event, events.Done):
                    event.overhead_ms = overhead_ms(arrived, event.engine_ms)
                await save(event, cancelled=False)
            yield event
    finally:
        try:
            if not saved:
                # Closed or cancelled before its end (the client hung up).
                await save(None, cancelled=True)
        finally:
            await answer.aclose()
