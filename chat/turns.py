"""One chat turn across every interface: persist at the start, stream the pipeline, persist at the end.

`run_turn` yields the pipeline's events (plus a leading `session` event) and
guarantees the assistant message ends as complete, partial, failed or cancelled,
also when the consumer stops iterating or its task is cancelled (Stop pressed,
socket gone).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from chat import services
from chat.models import ChatSession, Message
from routing import pipeline


@dataclass(kw_only=True)
class SessionEvent(pipeline.Event):
    id: int
    title: str
    message_id: int
    type: str = "session"


def _status(final: pipeline.Event | None, cancelled: bool, produced: bool) -> str:
    if isinstance(final, pipeline.Done):
        return Message.Status.COMPLETE
    if cancelled:
        return Message.Status.CANCELLED
    if isinstance(final, pipeline.Error) and final.partial:
        return Message.Status.PARTIAL
    return Message.Status.PARTIAL if produced else Message.Status.FAILED


async def run_turn(*, user, content, session_id: int | None = None, client: str = "web",
                   source: str = ChatSession.Source.WEB, model: str | None = None, max_tokens: int | None = None,
                   temperature: float | None = None, history: list[dict] | None = None,
                   groups: frozenset[str] | None = None, system: str = "",
                   admitted: bool = False) -> AsyncIterator[pipeline.Event]:
    """Validate, rate-limit, persist, answer. Raises ChatError subclasses before anything is stored.
    `admitted=True`: the caller already validated `content` (`services.message_validate`, whose
    result it passes) and counted the question against the user's limit.

    With `history` and `groups` given (the /v1 API: the client sends the conversation, the key
    lookup brought the user's groups), the answer needs nothing from the turn's rows, so it
    starts while they are written: the KB check or the engine's first token does not wait for
    the statement, which under load waits its turn on a busy event loop."""
    if not admitted:
        content = services.message_validate(content)

    # The turn's start: the rate limit (one Redis round trip, on the loop) and one statement (on
    # the loop inside core.db.unbound, as /v1 and the socket run; in the request's thread elsewhere).
    if not admitted:
        await services.arate_limit_hit(user_id=user.pk)
    starting = services.aturn_start(user=user, session_id=session_id, content=content, source=source,
                                    history=history)

    def request_for(history: list[dict], groups: frozenset[str]) -> pipeline.RouteRequest:
        return pipeline.RouteRequest(text=content, history=history, user_id=user.pk, groups=groups, client=client,
                                     model=model, max_tokens=max_tokens, temperature=temperature, system=system)

    first: asyncio.Future | None = None
    if history is not None and groups is not None:
        answer = pipeline.answer(request_for(history, groups))
        first = asyncio.ensure_future(answer.__anext__())  # the pipeline up to its first event
        try:
            start = await starting
        except BaseException:
            await _abandon(first, answer)
            raise
    else:
        start = await starting
        answer = pipeline.answer(request_for(start.history, start.groups))
    yield SessionEvent(id=start.session_id, title=start.title, message_id=start.assistant_id)

    parts: list[str] = []
    route = None
    saved = False

    async def save(final: pipeline.Event | None, cancelled: bool) -> None:
        nonlocal saved
        saved = True
        error = final if isinstance(final, pipeline.Error) else None
        if cancelled:
            error = pipeline.Error(code="cancelled", message="stopped before the answer finished")
        fields = {"message_id": start.assistant_id, "status": _status(final, cancelled, bool(parts)),
                  "content": "".join(parts), "route": route,
                  "done": final if isinstance(final, pipeline.Done) else None, "error": error}
        # Shielded: the row must be written even while this task is being cancelled.
        await asyncio.shield(services.aturn_finish(**fields))

    try:
        pending = first  # the first event, when the pipeline started before the rows were in
        while True:
            try:
                event = await (pending if pending is not None else answer.__anext__())
            except StopAsyncIteration:
                break
            pending = None
            if isinstance(event, pipeline.Route):
                route = event
            elif isinstance(event, pipeline.Token):
                parts.append(event.text)
            elif isinstance(event, (pipeline.Done, pipeline.Error)):
                # Stored before the client hears the end: a page that reloads now finds the answer.
                await save(event, cancelled=False)
            yield event
    finally:
        await _abandon(first, answer)
        if not saved:
            # Closed or cancelled mid-answer (Stop, socket gone, crash of the caller).
            await save(None, cancelled=True)


async def _abandon(first: asyncio.Future | None, answer: AsyncIterator[pipeline.Event]) -> None:
    """Stop the pipeline (and so the engine's stream) whatever it is doing: running its first
    step in a task of its own, or suspended between events."""
    if first is not None:
        if not first.done():
            first.cancel()
            await asyncio.wait({first})
        if not first.cancelled():
            first.exception()  # retrieved: a failure here belongs to a turn that is already over
    await answer.aclose()
