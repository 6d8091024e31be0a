"""Writes for conversations and API keys. Validate, then mutate."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from chat.exceptions import (
    ApiKeyInvalid,
    MessageInvalid,
    MessageTooLarge,
    RateLimited,
    SessionNotFound,
    TooManyStreams,
)
from chat.models import ApiKey, ChatSession, Message
from core import db, rawsql, slots
from core import redis as core_redis
from core.flight import SingleFlight
from core.text import text_problem

logger = logging.getLogger(__name__)

# --- sessions -----------------------------------------------------------------------------------------


def session_get(*, user, session_id: int) -> ChatSession:
    """The user's own session; another user's is indistinguishable from a missing one."""
    session = ChatSession.objects.filter(pk=session_id, user=user).first()
    if session is None:
        raise SessionNotFound(f"No chat session {session_id}.")
    return session


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


# --- turns ----------------------------------------------------------------------------------------------


def message_validate(content) -> str:
    if not isinstance(content, str):
        raise MessageInvalid(
            "The message content must be text.", fields={"content": "must be a string"}
        )
    if len(content) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise MessageTooLarge(
            f"The message has {len(content)} characters; the limit is {settings.CHAT_MAX_MESSAGE_CHARS}.",
            fields={"content": f"at most {settings.CHAT_MAX_MESSAGE_CHARS} characters"},
        )
    if not content.strip():
        raise MessageInvalid("The message is empty.", fields={"content": "must not be empty"})
    if (problem := text_problem(content)) is not None:
        raise MessageInvalid(f"The message {problem}.", fields={"content": problem})
    return content.strip()


def _rate_window(user_id: int) -> tuple[str, int, int]:
    window = settings.CHAT_RATE_WINDOW
    now = int(time.time())
    return (
        f"{settings.REDIS_KEY_PREFIX}:chat:rate:{user_id}:{now // window}",
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
    then counted) and one of the user's stream slots. Returns the pipeline to execute (blocking or
    async, as `client` is), the rate limit's retry delay and the slot it tries to take."""
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
            f"Too many questions: at most {settings.CHAT_RATE_LIMIT} per {settings.CHAT_RATE_WINDOW} s. "
            f"Try again in {retry_after} s.",
            retry_after=retry_after,
        )
    if not taken:
        return TooManyStreams(
            f"Too many answers at once: at most {settings.CHAT_MAX_STREAMS_PER_USER} may be in progress per "
            f"user. Try again when one has finished.",
            retry_after=STREAMS_RETRY_AFTER,
        )
    return None


def question_admit(*, user_id: int) -> StreamSlot:
    """Count the question against the user's rate limit (a fixed window) and take one of the user's
    CHAT_MAX_STREAMS_PER_USER stream slots, both in Redis, shared by every process: one round trip.
    Raises RateLimited or TooManyStreams when over. The slot goes back with `astream_slot_release`
    at the turn's end (chat.turns does it), or by itself when its lease ends."""
    client = core_redis.client()
    pipe, retry_after, slot = _admission(client, user_id)
    _, count, taken = pipe.execute()
    if (refused := _refusal(count, taken, retry_after)) is not None:
        if taken:
            slots.give_back(client, key=slot.key, holder=slot.holder)
        raise refused
    return slot


async def aquestion_admit(*, user_id: int) -> StreamSlot:
    """question_admit on the event loop."""
    client = core_redis.aclient()
    pipe, retry_after, slot = _admission(client, user_id)
    _, count, taken = await pipe.execute()
    if (refused := _refusal(count, taken, retry_after)) is not None:
        if taken:
            await slots.give_back(client, key=slot.key, holder=slot.holder)
        raise refused
    return slot


async def astream_slot_release(*, slot: StreamSlot) -> None:
    """Give the slot back: one round trip. Never raises: a slot Redis did not hear back about
    ends with its lease, and the answer it counted is over either way."""
    try:
        await slots.give_back(core_redis.aclient(), key=slot.key, holder=slot.holder)
    except Exception:  # noqa: BLE001 - see the docstring
        logger.warning("could not give back a stream slot of %s", slot.key, exc_info=True)


@dataclass(frozen=True)
class TurnStart:
    session_id: int
    title: str
    assistant_id: int
    history: list[dict]  # earlier turns for the prompt, oldest first
    groups: frozenset[str]  # the user's group names, for the routing rules


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
            f"INSERT INTO {session} (user_id, title, source, created_at, updated_at) "
            "VALUES (%(user)s, %(title)s, %(source)s, %(now)s, %(now)s) RETURNING id, title"
        )
    else:
        # The row lock of the UPDATE orders concurrent turns of one session, as SELECT FOR UPDATE
        # did.
        the_session = (
            f"UPDATE {session} SET updated_at = %(now)s WHERE id = %(sid)s AND user_id = %(user)s "
            "RETURNING id, title"
        )
    earlier = (
        f"SELECT role, content, created_at, id FROM {message} WHERE session_id = %(sid)s "
        "AND status <> %(streaming)s AND content <> '' ORDER BY created_at DESC, id DESC LIMIT %(turns)s"
        if read_history
        else "SELECT NULL::text AS role, NULL::text AS content, "
        "NULL::timestamptz AS created_at, NULL::bigint AS id WHERE false"
    )
    sql = f"""
        WITH s AS ({the_session}),
        h AS ({earlier}),
        m AS (
            INSERT INTO {message} (session_id, role, content, status, road, rule, target, citations, error, created_at)
            SELECT s.id, v.role, v.content, v.status, '', '', '', '[]'::jsonb, '', %(now)s
            FROM s CROSS JOIN (VALUES (1, %(user_role)s, %(content)s, %(complete)s),
                                      (2, %(assistant_role)s, '', %(streaming)s)) AS v (n, role, content, status)
            ORDER BY v.n
            RETURNING id, role
        )
        SELECT s.id, s.title, (SELECT id FROM m WHERE role = %(assistant_role)s),
            ARRAY({_groups_sql("%(user)s")}),
            ARRAY(SELECT role FROM h ORDER BY created_at, id), ARRAY(SELECT content FROM h ORDER BY created_at, id)
        FROM s
    """
    return sql, params


def warm_statements() -> list[tuple[str, list | dict]]:
    """The API key lookup and a turn's statements in a form that changes nothing (a prefix no key
    has, the start explained, the end updating no row), for the warm-up: a fresh database
    connection loads the tables' and indexes' metadata on first use, a few ms that would
    otherwise land in the first user's question."""
    start, params = _turn_start_statement(
        user_id=0,
        session_id=None,
        content="warm-up",
        source=ChatSession.Source.API,
        read_history=False,
    )
    # The API key lookup first: every /v1 request makes it, a new key's first one on the loop.
    return [
        (_live_key_sql(), [""]),
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
    sid, title, assistant_id, groups, roles, contents = row
    if history is None:
        history = [
            {"role": role, "content": text} for role, text in zip(roles, contents, strict=True)
        ]
    return TurnStart(
        session_id=sid,
        title=title,
        assistant_id=assistant_id,
        history=list(history),
        groups=frozenset(groups),
    )


async def aturn_finish(
    *, message_id: int, status: str, content: str, route=None, done=None, error=None
) -> None:
    """Persist the end of an assistant turn: its text, status, route, timings and usage (one UPDATE)."""
    await db.query_one(
        *_turn_finish_statement(
            message_id=message_id,
            status=status,
            content=content,
            route=route,
            done=done,
            error=error,
        )
    )


def _turn_finish_statement(
    *, message_id: int, status: str, content: str, route, done, error
) -> tuple[str, dict]:
    fields = {"status": status, "content": content, "finished_at": timezone.now()}
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
    return (
        f"UPDATE {Message._meta.db_table} SET {assignments} WHERE id = %(message_id)s",
        {**fields, "message_id": message_id},
    )


def messages_fail_stale() -> int:
    """Turns still `streaming` long after they started belong to a process that died: fail them."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.CHAT_STALE_STREAMING_AFTER)
    return Message.objects.filter(status=Message.Status.STREAMING, created_at__lt=cutoff).update(
        status=Message.Status.FAILED,
        error="interrupted: the server stopped before the answer finished",
        finished_at=timezone.now(),
    )


# --- API keys ------------------------------------------------------------------------------------------------


def apikey_create(*, user, name: str, scopes: list[str]) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the raw key, which is never stored and shown only now."""
    name = (name or "").strip()
    errors = {}
    if not name or len(name) > 100:
        errors["name"] = "must be 1 to 100 characters"
    scopes = sorted(set(scopes or []))
    if not scopes or not set(scopes) <= set(ApiKey.Scope.values):
        errors["scopes"] = f"must be a non-empty subset of {', '.join(ApiKey.Scope.values)}"
    elif ApiKey.Scope.KB in scopes and not user.is_staff:
        errors["scopes"] = "the kb scope is for staff users"
    if not errors and ApiKey.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
        errors["name"] = "you already have a key with this name"
    if errors:
        raise ApiKeyInvalid(fields=errors)
    prefix = secrets.token_hex(4)
    raw = f"gw_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        user=user, name=name, prefix=prefix, key_hash=ApiKey.hash(raw), scopes=scopes
    )
    return key, raw


def apikey_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke now in this process; other processes refuse it within API_KEY_CACHE_SECONDS."""
    for digest in [d for d, (_, cached) in _recent_keys.items() if cached.pk == key.pk]:
        _recent_keys.pop(digest, None)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def _groups_sql(user: str) -> str:
    """The names of the groups of the user whose id is the SQL expression `user`."""
    user_model = get_user_model()
    groups = user_model._meta.get_field("groups")
    through = groups.remote_field.through._meta
    return (
        f"SELECT g.name FROM {through.db_table} ug JOIN {groups.related_model._meta.db_table} g "
        f"ON g.id = ug.{through.get_field('group').column} WHERE ug.{through.get_field('user').column} = {user}"
    )


def _live_key_sql() -> str:
    user_model = get_user_model()
    # The user's group names come along: routing rules read them, and /v1 starts an answer
    # before the turn's rows (whose statement also reads them) are written.
    return (
        f"SELECT {rawsql.columns(ApiKey, 'k')}, {rawsql.columns(user_model, 'u')}, "
        f"ARRAY({_groups_sql(f'u.{user_model._meta.pk.column}')}) "
        f"FROM {ApiKey._meta.db_table} k JOIN {user_model._meta.db_table} u "
        f"ON u.{user_model._meta.pk.column} = k.{ApiKey._meta.get_field('user').column} "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL"
    )


def _live_key(prefix: str) -> ApiKey | None:
    """The unrevoked key with `prefix`, its user attached: one statement on every API call."""
    with connection.cursor() as cursor:
        cursor.execute(_live_key_sql(), [prefix])
        return _key_from(cursor.fetchone())


def _key_from(row) -> ApiKey | None:
    if row is None:
        return None
    key = rawsql.instance(ApiKey, row)
    key.user = rawsql.instance(get_user_model(), row, rawsql.width(ApiKey))
    key.group_names = frozenset(row[-1])
    return key


def _key_checked(key: ApiKey | None, raw: str) -> ApiKey | None:
    if (
        key is None
        or not key.user.is_active
        or not secrets.compare_digest(key.key_hash, ApiKey.hash(raw))
    ):
        return None
    return key


def _key_stale(key: ApiKey, now) -> bool:
    # One write a minute at most: last-used is for humans, not an audit log.
    return key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60


# raw key's hash -> (monotonic expiry, key): the API's hot path skips the lookup for a few seconds.
_recent_keys: dict[str, tuple[float, ApiKey]] = {}
_lookups = SingleFlight()


async def aapikey_authenticate(raw: str) -> ApiKey | None:
    """apikey_authenticate for async callers, trusting a key it found within the last
    API_KEY_CACHE_SECONDS: a revoked key (or deactivated user) is refused within that time."""
    digest = ApiKey.hash(raw)
    now = time.monotonic()
    hit = _recent_keys.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    # When a busy key's trust runs out, its concurrent requests share one lookup.
    key = await _lookups.do(digest, lambda: _alookup(raw))
    if key is not None and settings.API_KEY_CACHE_SECONDS:
        if len(_recent_keys) > 10_000:
            _recent_keys.clear()  # bounded: a cache, not a registry of every key ever used
        _recent_keys[digest] = (now + settings.API_KEY_CACHE_SECONDS, key)
    else:
        _recent_keys.pop(digest, None)
    return key


def _prefix_of(raw: str) -> str | None:
    parts = (raw or "").split("_", 2)  # the secret part may itself contain "_"
    return parts[1] if len(parts) == 3 and parts[0] == "gw" else None


async def _alookup(raw: str) -> ApiKey | None:
    prefix = _prefix_of(raw)
    if prefix is None:
        return None
    key = _key_checked(_key_from(await db.query_one(_live_key_sql(), [prefix])), raw)
    now = timezone.now()
    if key is not None and _key_stale(key, now):
        # Written behind the answer: the request does not wait for the commit.
        task = asyncio.get_running_loop().create_task(_atouch(key.pk, now))
        _touches.add(task)
        task.add_done_callback(_touches.discard)
        key.last_used_at = now
    return key


_touches: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks


async def _atouch(key_id: int, now) -> None:
    try:
        await db.query_one(
            f"UPDATE {ApiKey._meta.db_table} SET last_used_at = %s WHERE id = %s", [now, key_id]
        )
    except Exception:  # noqa: BLE001 - a lost last-used time is not worth a failed request
        logger.warning("could not record the last use of API key %s", key_id, exc_info=True)


def apikey_authenticate(raw: str) -> ApiKey | None:
    """The live key for `raw`, or None. Looked up by prefix, compared by hash in constant time."""
    prefix = _prefix_of(raw)
    if prefix is None:
        return None
    key = _key_checked(_live_key(prefix), raw)
    now = timezone.now()
    if key is not None and _key_stale(key, now):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key
