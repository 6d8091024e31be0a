"""One chat turn across every interface: persist at the start, stream the pipeline, persist at
the end.

`run_turn` yields the pipeline's events (plus a leading `session` event) and
guarantees the assistant message ends as complete, partial, failed or cancelled,
also when the consumer stops iterating or its task is cancelled (Stop pressed,
socket gone).

A process that is shutting down (config.drain) first refuses new turns (`turns_refuse_new`):
each is refused with `Draining` (a retryable 503) before anything is stored or counted, while the
turns running go on. Those still running when the drain is over are ended by
`turns_end_running`: each one's last event is an error `shutdown`, and it is stored as partial
(failed before its first token).
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from chat import services, versions
from chat.exceptions import Draining
from chat.turn_record import overhead_ms, turn_log_row, turn_status
from chat.turn_request import Admitted, TurnRequest
from core import db
from observability import metrics
from observability.requestlog import request_note
from routing import events, pipeline

# The process's intake (config.drain): flags read once per turn, and the tasks running a turn,
# added and removed once per turn. Nothing here is touched per token.
_refusing = False
_ending = False
_running: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()
# The client goes to another process; this one only finishes what it has.
DRAINING_RETRY_AFTER = 1


def turns_refuse_new() -> None:
    """Refuse new turns in this process from now on; the running ones go on."""
    global _refusing
    _refusing = True


def turn_admit() -> None:
    """Raise Draining when this process takes no new turns."""
    if _refusing:
        raise Draining(
            "This server is shutting down and takes no new chats; retry, another one will answer.",
            retry_after=DRAINING_RETRY_AFTER,
        )


def turns_running() -> list[asyncio.Task]:
    return [task for task in _running if not task.done()]


def turns_end_running() -> list[asyncio.Task]:
    """End every running turn as a shutdown: each one's task is cancelled, and the turn, seeing
    that the process is ending, turns the cancellation into its last event. Returns the tasks."""
    global _ending
    _ending = True
    tasks = turns_running()
    for task in tasks:
        task.cancel()
    return tasks


def _shutdown(route: events.Route | None, produced: bool) -> events.Error:
    return events.Error(
        code="shutdown",
        message="The server shut down before the answer finished; ask again.",
        retryable=True,
        retry_after=DRAINING_RETRY_AFTER,
        partial=produced,
        road=route.road if route else None,
        rule=route.rule if route else None,
        target=route.target if route else None,
    )


# A route's details (KB scores and thresholds, rule conditions, the endpoints and how they failed)
# are for the staff who may read the routing rules, as the route explainer requires; everyone else
# reads the road and a plain reason (events.Event.as_dict). The stored turn keeps the details.
ROUTE_DETAILS_PERMISSION = "routing.view_routingrule"


def reads_route_details(user) -> bool:
    # Not staff: no permission query at all (the common case, on every question).
    return bool(user.is_staff and user.has_perm(ROUTE_DETAILS_PERMISSION))


async def areads_route_details(user) -> bool:
    return bool(user.is_staff and await db.run(reads_route_details, user))


@dataclass(kw_only=True)
class SessionEvent(events.Event):
    id: int
    title: str
    message_id: int
    question_id: int | None = None
    type: str = "session"


async def _ready(start: services.TurnStart) -> services.TurnStart:
    return start


async def aquestion_intake(turn: TurnRequest) -> Admitted:
    """The one way in for a question: every refusal (draining, bad text, the rate limit, too many
    answers at once, for a new version the exchange it replaces) raised before anything is stored
    or counted. A regeneration or an edit is started here too (`Admitted.started`), so that a
    refusal of it (not the last exchange, another user's message) is one as well: the chat API's
    streams call it before their headers go out, run_turn when its caller did not."""
    turn_admit()  # draining: refused before anything is counted
    content = (
        turn.content if turn.regenerate is not None else services.message_validate(turn.content)
    )
    slot = await services.aquestion_admit(user_id=turn.user.pk)
    if turn.redo is None:
        return Admitted(content, slot)
    try:
        started = await versions.aturn_redo_start(
            user=turn.user,
            message_id=turn.redo,
            content=None if turn.regenerate is not None else content,
        )
    except BaseException:
        if slot is not None:
            await asyncio.shield(services.astream_slot_release(slot=slot))
        raise
    return Admitted(content, slot, started)


async def run_turn(
    turn: TurnRequest,
    *,
    admitted: Admitted | None = None,
    arrived: float | None = None,
    request_key: uuid.UUID | None = None,
    parts: list[str] | None = None,
) -> AsyncGenerator[events.Event, None]:
    """Take the question in, persist, answer: yields the pipeline's events (a `session` event
    first when the turn is stored). Raises ChatError subclasses before anything is stored.
    `admitted`: the caller took the question in already (`aquestion_intake`); the turn gives its
    slot back. The slot goes back before the last event is yielded: a client that starts its next
    question as soon as it hears the end finds it free.

    With the history and groups in the request (/v1), the answer starts while the turn's rows are
    written: the KB check or the engine's first token does not wait for the statement, which under
    load waits its turn on a busy event loop. A turn that stores nothing writes no chat rows: the
    request log keeps what the request did.

    `arrived` is the request's arrival on the loop's clock (`time.monotonic()`), when the
    interface saw it before this call: the request log's times and the gateway's overhead
    (`Done.overhead_ms`) count from there. `request_key` names the answer in the request log, the
    KB's records, the stored message and the user's feedback (the /v1 completion id is made from
    it); a new one when not given. `parts`: the list the answer's tokens are kept in, as they
    arrive (a caller that shares the answer with other sockets reads it: chat.live)."""
    user = turn.user
    task = asyncio.current_task()
    arrived = time.monotonic() if arrived is None else arrived
    request_key = request_key or uuid.uuid4()
    spent = events.Spent()  # the pipeline fills it in; the request log reads it

    def request_for(content: str, history: list[dict], groups: frozenset[str]):
        return events.RouteRequest(
            text=content,
            history=history,
            user_id=user.pk,
            groups=groups,
            client=turn.client,
            priority=turn.priority,
            model=turn.model,
            max_tokens=turn.max_tokens,
            temperature=turn.temperature,
            system=turn.system,
            passthrough=turn.passthrough,
            store=turn.store,
            key=request_key,
            api_key_id=turn.api_key_id,
            spent=spent,
        )

    _running.add(task)  # type: ignore[arg-type]  # run_turn runs in a task
    begun = await _begin(turn, admitted, request_for)
    answer, first, start, slot = begun.answer, begun.first, begun.start, begun.slot
    if start is not None:
        try:
            yield SessionEvent(
                id=start.session_id,
                title=start.title,
                message_id=start.assistant_id,
                question_id=start.question_id,
            )
        except BaseException:
            # The caller left before the answer began: nothing to save, a slot to give back.
            await _abandon(first, answer)
            if slot is not None:
                await asyncio.shield(services.astream_slot_release(slot=slot))
            raise

    parts = [] if parts is None else parts
    route = None
    saved = False
    first_token_at: float | None = None
    metrics.request_started(turn.interface)

    async def save(final: events.Event | None, cancelled: bool) -> None:
        nonlocal saved, slot
        saved = True
        if cancelled and _ending:
            # Cut by the process's end, not by the user, even where its last event could not be
            # sent.
            final, cancelled = _shutdown(route, bool(parts)), False
        error = final if isinstance(final, events.Error) else None
        if cancelled:
            error = events.Error(code="cancelled", message="stopped before the answer finished")
        status = turn_status(final, cancelled, bool(parts))
        done = final if isinstance(final, events.Done) else None
        record = turn_log_row(
            arrived=arrived,
            first_token_at=first_token_at,
            interface=turn.interface,
            user_id=user.pk,
            api_key_id=turn.api_key_id,
            session_id=start.session_id if start else None,
            status=status,
            route=route,
            done=done,
            error=error,
            key=request_key,
            spent=spent,
            features=turn.passthrough.features,
        )
        request_note(record)
        metrics.request_ended(record)
        ending = []
        if start is not None:
            ending.append(
                services.aturn_finish(
                    message_id=start.assistant_id,
                    status=status,
                    content="".join(parts),
                    route=route,
                    done=done,
                    error=error,
                    request_key=request_key,
                    question_id=start.question_id,
                )
            )
        if slot is not None:
            ending.append(
                services.astream_slot_release(slot=slot)
            )  # beside the row's write, not after it
            slot = None
        # Shielded: the row must be written and the slot given back even while this task is being
        # cancelled.
        if len(ending) == 1:
            await asyncio.shield(ending[0])
        elif ending:
            await asyncio.shield(asyncio.gather(*ending))

    try:
        pending = first  # the first event, when the pipeline started before the rows were in
        while True:
            try:
                event = await (pending if pending is not None else answer.__anext__())
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                if not _ending:
                    raise
                # turns_end_running: the answer ends here, and its last event tells the client
                # why.
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # run_turn runs in a task
                event = _shutdown(route, bool(parts))
                await save(event, cancelled=False)
                yield event
                break
            pending = None
            if isinstance(event, events.Token):
                if first_token_at is None:
                    first_token_at = time.monotonic()
                parts.append(event.text)
            elif isinstance(event, events.Route):
                route = event
            elif isinstance(event, (events.Done, events.Error)):
                if isinstance(event, events.Done):
                    event.overhead_ms = overhead_ms(arrived, event.engine_ms)
                # Stored before the client hears the end: a page that reloads now finds the answer.
                await save(event, cancelled=False)
            yield event
    finally:
        _running.discard(task)  # type: ignore[arg-type]  # run_turn runs in a task
        await _abandon(first, answer)
        if not saved:
            # Closed or cancelled mid-answer (Stop, socket gone, crash of the caller).
            await save(None, cancelled=True)


@dataclass
class _Begun:
    answer: AsyncGenerator[events.Event, None]  # the pipeline
    first: asyncio.Future | None  # its first event, when it started before the rows were in
    start: services.TurnStart | None  # the rows written (None: a turn that stores nothing)
    slot: services.StreamSlot | None


async def _begin(turn: TurnRequest, admitted: Admitted | None, request_for) -> _Begun:
    """The turn's start: the question taken in (unless the caller did), its rows written and the
    pipeline started. With the history and groups in the request (/v1) the pipeline starts while
    the rows are written. Refused (draining, no such session), failed or abandoned here: nothing
    is left running and the slot goes back."""
    slot = admitted.slot if admitted is not None else None
    try:
        turn_admit()  # a caller that took the question in before the drain began
        if admitted is None:
            # The rate limit and a stream slot (one Redis round trip, on the loop), and for a new
            # version its start; then one statement (on the loop inside core.db.unbound, as /v1
            # and the socket run; in the request's thread elsewhere).
            admitted = await aquestion_intake(turn)
            slot = admitted.slot
        content = admitted.content
        if admitted.started is not None:  # a new version of the last exchange (aquestion_intake)
            starting = _ready(admitted.started)
        elif turn.store:
            starting = services.aturn_start(
                user=turn.user,
                session_id=turn.session_id,
                content=content,  # type: ignore[arg-type]  # a stored turn has its text
                source=turn.source,
                history=turn.history,
            )
        else:
            starting = None
        if turn.history is not None and turn.groups is not None:
            answer = pipeline.answer(request_for(content, turn.history, turn.groups))
            if starting is None:
                return _Begun(answer, None, None, slot)
            first = asyncio.ensure_future(answer.__anext__())  # the pipeline to its first event
            try:
                return _Begun(answer, first, await starting, slot)
            except BaseException:
                await _abandon(first, answer)
                raise
        start = await starting  # type: ignore[misc]  # an unstored turn has its history
        if turn.regenerate is not None:
            content = start.question  # the stored question, answered again
        answer = pipeline.answer(request_for(content, start.history, start.groups))
        return _Begun(answer, None, start, slot)
    except BaseException:
        if slot is not None:
            await asyncio.shield(services.astream_slot_release(slot=slot))
        raise


async def _abandon(
    first: asyncio.Future | None, answer: AsyncGenerator[events.Event, None]
) -> None:
    """Stop the pipeline (and so the engine's stream) whatever it is doing: running its first
    step in a task of its own, or suspended between events."""
    if first is not None:
        if not first.done():
            first.cancel()
            await asyncio.wait({first})
        if not first.cancelled():
            first.exception()  # retrieved: a failure here belongs to a turn that is already over
    await answer.aclose()
