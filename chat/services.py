"""Writes for conversations and API keys. Validate, then mutate."""

from __future__ import annotations

import secrets
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from chat.exceptions import ApiKeyInvalid, MessageInvalid, MessageTooLarge, RateLimited, SessionNotFound
from chat.models import ApiKey, ChatSession, Message
from config import rawsql
from core import db

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
        raise MessageInvalid("The message content must be text.", fields={"content": "must be a string"})
    if len(content) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise MessageTooLarge(
            f"The message has {len(content)} characters; the limit is {settings.CHAT_MAX_MESSAGE_CHARS}.",
            fields={"content": f"at most {settings.CHAT_MAX_MESSAGE_CHARS} characters"},
        )
    if not content.strip():
        raise MessageInvalid("The message is empty.", fields={"content": "must not be empty"})
    return content.strip()


def rate_limit_hit(*, user_id: int) -> None:
    """A fixed window per user in Redis, shared by every process. Raises RateLimited when over."""
    window = settings.CHAT_RATE_WINDOW
    now = int(time.time())
    key = f"chat:rate:{user_id}:{now // window}"
    try:
        count = cache.incr(key)
    except ValueError:
        cache.add(key, 0, timeout=window + 5)
        count = cache.incr(key)
    if count > settings.CHAT_RATE_LIMIT:
        retry_after = window - now % window
        raise RateLimited(
            f"Too many questions: at most {settings.CHAT_RATE_LIMIT} per {window} s. Try again in {retry_after} s.",
            retry_after=retry_after,
        )


def turn_start(*, user, session_id: int | None, content: str, source: str = ChatSession.Source.WEB,
               history: list[dict] | None = None) -> tuple[ChatSession, Message, Message, list[dict]]:
    """Persist the user's message and an assistant message in `streaming` state.

    Returns (session, user message, assistant message, history for the prompt). With
    `history` given (the /v1 API sends its own), the stored conversation is not read.
    """
    with transaction.atomic():
        if session_id is None:
            session = session_create(user=user, title=content, source=source)
        else:
            session = ChatSession.objects.select_for_update().filter(pk=session_id, user=user).first()
            if session is None:
                raise SessionNotFound(f"No chat session {session_id}.")
        if history is None:
            earlier = list(
                session.messages.exclude(status=Message.Status.STREAMING).exclude(content="")
                .order_by("-created_at", "-pk")[: settings.CHAT_HISTORY_TURNS]
            )
            history = [{"role": m.role, "content": m.content} for m in reversed(earlier)]
        user_message, assistant = Message.objects.bulk_create([
            Message(session=session, role=Message.Role.USER, content=content),
            Message(session=session, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING),
        ])
        if session_id is not None:  # a new session's updated_at is already now
            session.save(update_fields=["updated_at"])
    return session, user_message, assistant, history


def turn_finish(*, message_id: int, status: str, content: str, route=None, done=None, error=None) -> None:
    """Persist the end of an assistant turn: its text, status, route, timings and usage."""
    fields = {"status": status, "content": content, "finished_at": timezone.now()}
    if route is not None:
        fields.update(road=route.road or "", rule=route.rule or "", target=route.target or "")
    if done is not None:
        fields.update(ttft_ms=done.ttft_ms, latency_ms=done.latency_ms, citations=done.citations,
                      kb_entry_id=done.kb_entry_id)
        if done.usage:
            fields.update(prompt_tokens=done.usage["prompt_tokens"],
                          completion_tokens=done.usage["completion_tokens"])
    if error is not None:
        fields["error"] = f"{error.code}: {error.message}"
        if route is None and error.road:
            fields.update(road=error.road or "", rule=error.rule or "", target=error.target or "")
    Message.objects.filter(pk=message_id).update(**fields)


def messages_fail_stale() -> int:
    """Turns still `streaming` long after they started belong to a process that died: fail them."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.CHAT_STALE_STREAMING_AFTER)
    return Message.objects.filter(status=Message.Status.STREAMING, created_at__lt=cutoff).update(
        status=Message.Status.FAILED, error="interrupted: the server stopped before the answer finished",
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
    key = ApiKey.objects.create(user=user, name=name, prefix=prefix, key_hash=ApiKey.hash(raw), scopes=scopes)
    return key, raw


def apikey_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke now in this process; other processes refuse it within API_KEY_CACHE_SECONDS."""
    for digest in [d for d, (_, cached) in _recent_keys.items() if cached.pk == key.pk]:
        _recent_keys.pop(digest, None)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def _live_key(prefix: str) -> ApiKey | None:
    """The unrevoked key with `prefix`, its user attached: one statement on every API call."""
    user_model = get_user_model()
    sql = (f"SELECT {rawsql.columns(ApiKey, 'k')}, {rawsql.columns(user_model, 'u')} "
           f"FROM {ApiKey._meta.db_table} k JOIN {user_model._meta.db_table} u "
           f"ON u.{user_model._meta.pk.column} = k.{ApiKey._meta.get_field('user').column} "
           "WHERE k.prefix = %s AND k.revoked_at IS NULL")
    with connection.cursor() as cursor:
        cursor.execute(sql, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    key = rawsql.instance(ApiKey, row)
    key.user = rawsql.instance(user_model, row, rawsql.width(ApiKey))
    return key


# raw key's hash -> (monotonic expiry, key): the API's hot path skips the lookup for a few seconds.
_recent_keys: dict[str, tuple[float, ApiKey]] = {}


async def aapikey_authenticate(raw: str) -> ApiKey | None:
    """apikey_authenticate for async callers, trusting a key it found within the last
    API_KEY_CACHE_SECONDS: a revoked key (or deactivated user) is refused within that time."""
    digest = ApiKey.hash(raw)
    now = time.monotonic()
    hit = _recent_keys.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    key = await db.run(apikey_authenticate, raw)
    if key is not None and settings.API_KEY_CACHE_SECONDS:
        if len(_recent_keys) > 10_000:
            _recent_keys.clear()  # bounded: a cache, not a registry of every key ever used
        _recent_keys[digest] = (now + settings.API_KEY_CACHE_SECONDS, key)
    else:
        _recent_keys.pop(digest, None)
    return key


def apikey_authenticate(raw: str) -> ApiKey | None:
    """The live key for `raw`, or None. Looked up by prefix, compared by hash in constant time."""
    parts = (raw or "").split("_", 2)  # the secret part may itself contain "_"
    if len(parts) != 3 or parts[0] != "gw":
        return None
    key = _live_key(parts[1])
    if key is None or not key.user.is_active or not secrets.compare_digest(key.key_hash, ApiKey.hash(raw)):
        return None
    now = timezone.now()
    # One write a minute at most: last-used is for humans, not an audit log.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key
