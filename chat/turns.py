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
                   system: str = "", rate_limited: bool = False) -> AsyncIterator[pipeline.Event]:
    """Validate, rate-limit, persist, answer. Raises ChatError subclasses before anything is stored.
    `rate_limited=True`: the caller already counted this question against the user's limit."""
    content = services.message_validate(content)

    # The turn's start: the rate limit (one Redis round trip, on the loop) and one statement (on
    # the loop inside core.db.unbound, as /v1 and the socket run; in the request's thread elsewhere).
    if not rate_limited:
        await services.arate_limit_hit(user_id=user.pk)
    start = await services.aturn_start(user=user, session_id=session_id, content=content, source=source,
                                       history=history)
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
        request = pipeline.RouteRequest(text=content, history=start.history, user_id=user.pk, groups=start.groups,
                                        client=client, model=model, max_tokens=max_tokens, temperature=temperature,
                                        system=system)
        async for event in pipeline.answer(request):
            if isinstance(event, pipeline.Route):
                route = event
            elif isinstance(event, pipeline.Token):
                parts.append(event.text)
            elif isinstance(event, (pipeline.Done, pipeline.Error)):
                # Stored before the client hears the end: a page that reloads now finds the answer.
                await save(event, cancelled=False)
            yield event
    finally:
        if not saved:
            # Closed or cancelled mid-answer (Stop, socket gone, crash of the caller).
            await save(None, cancelled=True)
