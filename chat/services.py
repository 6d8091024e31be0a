"""Writes for conversations: sessions, turns (their start and end) and the admission of
questions. Validate, then mutate. API keys are chat.apikeys; new versions of the last exchange
chat.versions."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from psycopg.types.json import Jsonb
from redis.exceptions import RedisError

from chat.exceptions import (
    MessageInvalid,
    MessageTooLarge,
    RateLimited,
    SessionNotFound,
    TooManyStreams,
)
from chat.history import history_kept, history_replay
from chat.models import ChatSession, Message
from core import db, rawsql, slots
from core import redis as core_redis
from core.text import text_problem
from spend.ledger import outage_lets_through

logger = logging.getLogger(__name__)

# --- sessions -------------------------------------------------------------------------------------


def session_create(*, user, title: str = "", source: str = ChatSession.Source.WEB) -> ChatSession:
    return ChatSession.objects.create(user=user, title=_title(title), source=source)


def session_rename(*, session: ChatSession, title: str) -> ChatSession:
    title = _title(title)
    if not title:
        raise MessageInvalid("A title must not be empty.", fields={"title": "must not be empty"})
    session.title = title
    session.save(update_fields=["title", "updated_at"])
    return session


def session_delete(*, session: ChatSession) -> None:
    session.delete()


def _title(text: str) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= 80 else text[:79].rstrip() + "…"


# --- turns ----------------------------------------------------------------------------------------


def message_validate(content) -> str:
    if not isinstance(content, str):
        raise MessageInvalid(
            "The message content must be text.", fields={"content": "must be a string"}
        )
    if len(content) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise MessageTooLarge(
            f"The message has {len(content)} characters; "
            f"the limit is {settings.CHAT_MAX_MESSAGE_CHARS}.",
            fields={"content": f"at most {settings.CHAT_MAX_MESSAGE_CHARS} characters"},
        )
    if not content.strip():
        raise MessageInvalid("The message is empty.", fields={"content": "must not be empty"})
    if (problem := text_problem(content)) is not None:
        raise MessageInvalid(f"The message {problem}.", fields={"content": problem})
    return content.strip()


def _rate_window(user_id: int, counted: str = "") -> tuple[str, int, int]:
    """The user's counter of `counted` (questions: "") in the current window, the window's length
    and the seconds left of it."""
    window = settings.CHAT_RATE_WINDOW
    now = int(time.time())
    return (
        f"{settings.REDIS_KEY_PREFIX}:chat:rate:{counted}{user_id}:{now // window}",
        window,
        window - now % window,
    )


# A stream usually ends within seconds: come back soon rather than after the slots' lease.
STREAMS_RETRY_AFTER = 2


@dataclass(frozen=True)
class StreamSlot:
    """One of a user's answers in flight (core.slots), held from the turn's start to its end."""

    key: str
    holder: str


def _admission(client, user_id: int):
    """One round trip's commands: the rate window's counter (created with its expiry if missing,
    then counted) and one of the user's stream slots. Returns the pipeline to execute, the rate
    limit's retry delay and the slot it tries to take."""
    key, window, retry_after = _rate_window(user_id)
    pipe = client.pipeline(transaction=False)
    pipe.set(key, 0, ex=window + 5, nx=True)
    pipe.incr(key)
    # The slot's lease: a turn still streaming after this long belongs to a process that died.
    slot = StreamSlot(
        key=f"{settings.REDIS_KEY_PREFIX}:chat:streams:{user_id}", holder=slots.holder()
    )
    slots.take(
        pipe,
        key=slot.key,
        holder=slot.holder,
        limit=settings.CHAT_MAX_STREAMS_PER_USER,
        lease=settings.CHAT_STALE_STREAMING_AFTER,
    )
    return pipe, retry_after, slot


def _refusal(count: int, taken: int, retry_after: int) -> RateLimited | None:
    if count > settings.CHAT_RATE_LIMIT:
        return RateLimited(
            f"Too many questions: at most {settings.CHAT_RATE_LIMIT} "
            f"per {settings.CHAT_RATE_WINDOW} s. Try again in {retry_after} s.",
            retry_after=retry_after,
        )
    if not taken:
        return TooManyStreams(
            f"Too many answers at once: at most {settings.CHAT_MAX_STREAMS_PER_USER} "
            "may be in progress per user. Try again when one has finished.",
            retry_after=STREAMS_RETRY_AFTER,
        )
    return None


async def aquestion_admit(*, user_id: int) -> StreamSlot | None:
    """Count the question against the user's rate limit (a fixed window) and take one of the user's
    CHAT_MAX_STREAMS_PER_USER stream slots, both in Redis, shared by every process: one round trip.
    Raises RateLimited or TooManyStreams when over. The slot goes back with `astream_slot_release`
    at the turn's end (chat.turns does it), or by itself when its lease ends. Redis unreachable:
    the outage's error, or, with LIMITS_ON_REDIS_OUTAGE=open, None (admitted uncounted)."""
    client = core_redis.aclient()
    pipe, retry_after, slot = _admission(client, user_id)
    try:
        _, count, taken = await pipe.execute()
    except (RedisError, OSError) as exc:
        if outage_lets_through(exc, "the chat rate limit and stream slots"):
            return None
        raise
    if (refused := _refusal(count, taken, retry_after)) is not None:
        if taken:
            await slots.give_back(client, key=slot.key, holder=slot.holder)
        raise refused
    return slot


async def ajoin_admit(*, user_id: int) -> None:
    """Count a join (a socket of the user's watching one of the user's answers, chat.live)
    against CHAT_JOIN_RATE_LIMIT per CHAT_RATE_WINDOW, shared by every process: one round trip.
    A join is no question (a reload must not use up the questions), but it is not free either:
    a statement, and for an answer another process runs a publish and a wait. Raises
    RateLimited when over; Redis unreachable, as aquestion_admit."""
    key, window, retry_after = _rate_window(user_id, "joins:")
    pipe = core_redis.aclient().pipeline(transaction=False)
    pipe.set(key, 0, ex=window + 5, nx=True)
    pipe.incr(key)
    try:
        _, count = await pipe.execute()
    except (RedisError, OSError) as exc:
        if outage_lets_through(exc, "the chat join limit"):
            return
        raise
    if count > settings.CHAT_JOIN_RATE_LIMIT:
        raise RateLimited(
            f"Too many joins: at most {settings.CHAT_JOIN_RATE_LIMIT} "
            f"per {settings.CHAT_RATE_WINDOW} s. Try again in {retry_after} s.",
            retry_after=retry_after,
        )


async def astream_slot_release(*, slot: StreamSlot) -> None:
    """Give the slot back: one round trip. Never raises: a slot Redis did not hear back about
    ends with its lease, and the answer it counted is over either way."""
    try:
        await slots.give_back(core_redis.aclient(), key=slot.key, holder=slot.holder)
    except Exception:  # see the docstring
        logger.warning("could not give back a stream slot of %s", slot.key, exc_info=True)


@dataclass(frozen=True)
class TurnStart:
    session_id: int
    title: str
    assistant_id: int
    history: list[dict]  # earlier turns for the prompt, oldest first (a History when stored)
    groups: frozenset[str]  # the user's group names, for the routing rules
    question_id: int | None = None  # the stored question
    question: str = ""  # its text, when the turn answers a stored question again (chat.versions)


async def aturn_start(
    *,
    user,
    session_id: int | None,
    content: str,
    source: str = ChatSession.Source.WEB,
    history: list[dict] | None = None,
) -> TurnStart:
    """Persist the user's message and an assistant message in `streaming` state.

    One statement, so one round trip and no explicit transaction: the session (created, or the
    user's own touched), the two messages, the earlier turns and the user's groups. With
    `history` given (the /v1 API sends its own), the stored conversation is not read. A
    statement sees the rows as they were before it, so the history never holds the new turn.
    """
    sql, params = _turn_start_statement(
        user_id=user.pk,
        session_id=session_id,
        content=content,
        source=source,
        read_history=session_id is not None and history is None,
    )
    return _turn_started(await db.query_one(sql, params), session_id=session_id, history=history)


def _turn_start_statement(
    *, user_id: int, session_id: int | None, content: str, source: str, read_history: bool
) -> tuple[str, dict]:
    session, message = ChatSession._meta.db_table, Message._meta.db_table
    now = timezone.now()
    params = {
        "user": user_id,
        "now": now,
        "content": content,
        "sid": session_id,
        "source": source,
        "title": _title(content),
        "turns": settings.CHAT_HISTORY_TURNS,
        "user_role": Message.Role.USER,
        "assistant_role": Message.Role.ASSISTANT,
        "complete": Message.Status.COMPLETE,
        "streaming": Message.Status.STREAMING,
    }
    if session_id is None:
        the_session = (
            f"INSERT INTO {session} (user_id, title, source, created_at, updated_at) "  # noqa: S608 - _meta's names; values are parameters
            "VALUES (%(user)s, %(title)s, %(source)s, %(now)s, %(now)s) RETURNING id, title"
        )
    else:
        # The row lock of the UPDATE orders concurrent turns of one session, as SELECT FOR UPDATE
        # did.
        the_session = (
            f"UPDATE {session} SET updated_at = %(now)s WHERE id = %(sid)s AND user_id = %(user)s "  # noqa: S608 - _meta's names; values are parameters
            "RETURNING id, title"
        )
    # The session's messages a prompt may hold (the current versions, finished, with text): the
    # last CHAT_HISTORY_TURNS of them, and how many there are, for the stepped cut
    # (history_start).
    replayable = (
        f"FROM {message} WHERE session_id = %(sid)s "
        "AND status <> %(streaming)s AND content <> '' AND NOT superseded"
    )
    earlier = (
        f"SELECT role, content, context, created_at, id {replayable} "
        "ORDER BY created_at DESC, id DESC LIMIT %(turns)s"
        if read_history
        else "SELECT NULL::text AS role, NULL::text AS content, NULL::text AS context, "
        "NULL::timestamptz AS created_at, NULL::bigint AS id WHERE false"
    )
    total = f"(SELECT count(*) {replayable})" if read_history else "0"
    sql = f"""
        WITH s AS ({the_session}),
        h AS ({earlier}),
        m AS (
            INSERT INTO {message} (session_id, role, content, status, road, rule, target,
                                   citations, error, created_at)
            SELECT s.id, v.role, v.content, v.status, '', '', '', '[]'::jsonb, '', %(now)s
            FROM s CROSS JOIN (VALUES (1, %(user_role)s, %(content)s, %(complete)s),
                                      (2, %(assistant_role)s, '', %(streaming)s))
                AS v (n, role, content, status)
            ORDER BY v.n
            RETURNING id, role
        )
        SELECT s.id, s.title, (SELECT id FROM m WHERE role = %(assistant_role)s),
            (SELECT id FROM m WHERE role = %(user_role)s),
            ARRAY({rawsql.user_groups("%(user)s")}),
            ARRAY(SELECT role FROM h ORDER BY created_at, id),
            ARRAY(SELECT content FROM h ORDER BY created_at, id),
            ARRAY(SELECT context FROM h ORDER BY created_at, id),
            {total}
        FROM s
    """  # noqa: S608 - _meta's names; values are parameters
    return sql, params


def warm_statements() -> list[tuple[str, list | dict]]:
    """A turn's statements in a form that changes nothing (the start explained, the end updating
    no row), for the warm-up: a fresh database connection loads the tables' and indexes'
    metadata on first use, a few ms that would otherwise land in the first user's question."""
    start, params = _turn_start_statement(
        user_id=0,
        session_id=None,
        content="warm-up",
        source=ChatSession.Source.API,
        read_history=False,
    )
    return [
        (f"EXPLAIN {start}", params),
        _turn_finish_statement(
            message_id=-1,
            status=Message.Status.COMPLETE,
            content="",
            route=None,
            done=None,
            error=None,
        ),
    ]


def _turn_started(row, *, session_id: int | None, history: list[dict] | None) -> TurnStart:
    if row is None:
        raise SessionNotFound(f"No chat session {session_id}.")
    sid, title, assistant_id, question_id, groups, roles, contents, contexts, total = row
    if history is None:
        history = history_replay(
            history_kept(list(zip(roles, contents, contexts, strict=True)), total)
        )
    return TurnStart(
        session_id=sid,
        title=title,
        assistant_id=assistant_id,
        history=history,
        groups=frozenset(groups),
        question_id=question_id,
    )


async def aturn_finish(
    *,
    message_id: int,
    status: str,
    content: str,
    route=None,
    done=None,
    error=None,
    request_key=None,
    question_id: int | None = None,
) -> None:
    """Persist the end of an assistant turn: its text, status, route, timings, usage and request
    key, and, once a model was asked, the KB passages its question (`question_id`) was sent with
    (one statement)."""
    await db.query_one(
        *_turn_finish_statement(
            message_id=message_id,
            status=status,
            content=content,
            route=route,
            done=done,
            error=error,
            request_key=request_key,
            question_id=question_id,
        )
    )


def _turn_finish_statement(
    *,
    message_id: int,
    status: str,
    content: str,
    route,
    done,
    error,
    request_key=None,
    question_id: int | None = None,
) -> tuple[str, dict]:
    fields = {"status": status, "content": content, "finished_at": timezone.now()}
    if request_key is not None:
        fields["request_key"] = request_key
    if route is not None:
        fields.update(road=route.road or "", rule=route.rule or "", target=route.target or "")
    if done is not None:
        fields.update(
            ttft_ms=done.ttft_ms,
            latency_ms=done.latency_ms,
            citations=Jsonb(done.citations),
            kb_entry_id=done.kb_entry_id,
        )
        if done.usage:
            fields.update(
                prompt_tokens=done.usage["prompt_tokens"],
                completion_tokens=done.usage["completion_tokens"],
            )
    if error is not None:
        fields["error"] = f"{error.code}: {error.message}"
        if route is None and error.road:
            fields.update(road=error.road or "", rule=error.rule or "", target=error.target or "")
    # The column names are this function's own (Message's fields), never input.
    assignments = ", ".join(f'"{name}" = %({name})s' for name in fields)
    table = Message._meta.db_table
    params = {**fields, "message_id": message_id}
    question = ""
    if route is not None and question_id is not None:
        # The question's passages as this answer's prompt had them (a KB answer: none), written
        # in the same statement: what a later turn replays (history_replay).
        question = (
            f"WITH q AS (UPDATE {table} SET context = %(context)s WHERE id = %(question_id)s) "  # noqa: S608 - _meta's names; values are parameters
        )
        params.update(context=route.context, question_id=question_id)
    return (
        f"{question}UPDATE {table} SET {assignments} WHERE id = %(message_id)s",  # noqa: S608 - _meta's names; values are parameters
        params,
    )


def messages_fail_stale() -> int:
    """Turns still `streaming` long after they started belong to a process that died: fail them."""
    cutoff = timezone.now() - timedelta(seconds=settings.CHAT_STALE_STREAMING_AFTER)
    return Message.objects.filter(status=Message.Status.STREAMING, created_at__lt=cutoff).update(
        status=Message.Status.FAILED,
        error="interrupted: the server stopped before the answer finished",
        finished_at=timezone.now(),
    )
