"""API keys: created, revoked, and checked on every API call.

The DRF API checks a key in the database on each request (`apikey_authenticate`); /v1, whose
cost per request counts most, trusts a key it found within the last API_KEY_CACHE_SECONDS
(`apikey_authenticate_cached`), so a key revoked elsewhere is refused within that time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from chat.exceptions import ApiKeyInvalid
from chat.models import ApiKey
from core import db, rawsql
from core.flight import SingleFlight
from inference_ops.admission import CLASSES
from routing.validation import client_name_problem

logger = logging.getLogger(__name__)


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


def apikey_client_set(*, key: ApiKey, client_name: str) -> ApiKey:
    """Give a live key the client name routing rules know it by ("client:NAME"), or none ("").

    Staff only (the admin): a rule that lists clients decides a model and a system prompt, so
    what it matches must not be something the key's owner picks, as the key's name is. Several
    keys may share a client name (a partner's keys across a rotation). This process forgets the
    key's cached copy now; the others see the change within API_KEY_CACHE_SECONDS."""
    client_name = (client_name or "").strip()
    if client_name and (problem := client_name_problem(client_name)):
        raise ApiKeyInvalid(fields={"client_name": problem})
    if key.revoked_at is not None:
        raise ApiKeyInvalid(fields={"client_name": "the key is revoked"})
    _forget(key)
    key.client_name = client_name
    key.save(update_fields=["client_name"])
    return key


def apikey_priority_set(*, key: ApiKey, priority: str) -> ApiKey:
    """Give a live key its priority class at an endpoint's capacity ("" for the default, api).
    Staff only (the admin), as the client name: a key's owner does not move itself up the
    queue. The other processes see it within API_KEY_CACHE_SECONDS."""
    if priority and priority not in CLASSES:
        raise ApiKeyInvalid(fields={"priority": f"one of {', '.join(CLASSES)}, or empty"})
    if key.revoked_at is not None:
        raise ApiKeyInvalid(fields={"priority": "the key is revoked"})
    _forget(key)
    key.priority = priority
    key.save(update_fields=["priority"])
    return key


def apikey_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke now in this process; other processes refuse it within API_KEY_CACHE_SECONDS."""
    _forget(key)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def _forget(key: ApiKey) -> None:
    for digest in [d for d, (_, cached) in _recent_keys.items() if cached.pk == key.pk]:
        _recent_keys.pop(digest, None)


def apikey_authenticate(*, raw: str) -> ApiKey | None:
    """The live key for `raw`, or None. Looked up by prefix, compared by hash in constant time."""
    prefix = _prefix_of(raw)
    if prefix is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_live_key_sql(), [prefix])
        key = _key_checked(_key_from(cursor.fetchone()), raw)
    now = timezone.now()
    if key is not None and _key_stale(key, now):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


# raw key's hash -> (monotonic expiry, key): the API's hot path skips the lookup for a few seconds.
_recent_keys: dict[str, tuple[float, ApiKey]] = {}
_lookups = SingleFlight()


async def apikey_authenticate_cached(*, raw: str) -> ApiKey | None:
    """apikey_authenticate on the event loop, trusting a key it found within the last
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
            f"UPDATE {ApiKey._meta.db_table} SET last_used_at = %s WHERE id = %s",  # noqa: S608 - _meta's names; values are parameters
            [now, key_id],
        )
    except Exception:  # a lost last-used time is not worth a failed request
        logger.warning("could not record the last use of API key %s", key_id, exc_info=True)


def warm_statements() -> list[tuple[str, list | dict]]:
    """The key lookup with a prefix no key has, for the warm-up (config.warmup): every /v1
    request makes it, and a fresh connection's first one would load the tables' metadata."""
    return [(_live_key_sql(), [""])]


def _prefix_of(raw: str) -> str | None:
    parts = (raw or "").split("_", 2)  # the secret part may itself contain "_"
    return parts[1] if len(parts) == 3 and parts[0] == "gw" else None


def _live_key_sql() -> str:
    """The unrevoked key with a prefix, its user attached: one statement on every API call."""
    user_model = get_user_model()
    # The user's group names come along: routing rules read them, and /v1 starts an answer
    # before the turn's rows (whose statement also reads them) are written.
    return (
        f"SELECT {rawsql.columns(ApiKey, 'k')}, {rawsql.columns(user_model, 'u')}, "  # noqa: S608 - _meta's names; values are parameters
        f"ARRAY({rawsql.user_groups(f'u.{user_model._meta.pk.column}')}) "
        f"FROM {ApiKey._meta.db_table} k JOIN {user_model._meta.db_table} u "
        f"ON u.{user_model._meta.pk.column} = k.{ApiKey._meta.get_field('user').column} "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL"
    )


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
