"""Failed sign-ins, counted per username and per client address in Redis, for both sign-in pages.

The chat's login and the admin's login use the forms below, so one counter covers both: a
guesser cannot spend the username's allowance on one page and start again on the other. The
counters live in Redis, shared by every web process, and are checked before the password is:
once a limit is reached even the right password is refused until the window ends.

No user enumeration: a username that does not exist is counted and refused exactly as one
that does (its counter is keyed by the name typed, not by an account), with the same message.

The client address is REMOTE_ADDR, as elsewhere in the project: behind the TLS proxy, daphne's
`--proxy-headers` sets it from X-Forwarded-For, which the proxy must overwrite, not append to
(deploy/README.md).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.utils.translation import ngettext

from core import redis as core_redis


def _address_key(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address or "unknown"
    # One IPv6 subscriber holds a whole /64 and can pick a new address per attempt.
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


def _keys(*, username: str, address: str) -> tuple[str, str]:
    prefix = f"{settings.REDIS_KEY_PREFIX}:login:failures"
    # Case-folded: "Alice" and "alice" are one guess target. Hashed: the key holds no typed text.
    name = hashlib.sha256(username.casefold().encode()).hexdigest()
    return f"{prefix}:user:{name}", f"{prefix}:address:{_address_key(address)}"


def login_retry_after(*, username: str, address: str) -> int | None:
    """Seconds until this username may try again from this address, or None while both are under
    their limits."""
    user_key, address_key = _keys(username=username, address=address)
    pipe = core_redis.client().pipeline(transaction=False)
    for key in (user_key, address_key):
        pipe.get(key)
        pipe.ttl(key)
    user_count, user_ttl, address_count, address_ttl = pipe.execute()
    waits = [
        max(ttl, 1)  # a key expiring between the two reads still waits a moment
        for count, ttl, limit in (
            (user_count, user_ttl, settings.LOGIN_FAILURES_PER_USERNAME),
            (address_count, address_ttl, settings.LOGIN_FAILURES_PER_ADDRESS),
        )
        if count is not None and int(count) >= limit
    ]
    return max(waits) if waits else None


def login_failed(*, username: str, address: str) -> None:
    """Counts one failure against the username and the address. Each counter's window starts at
    its first failure (created with its expiry if missing, then counted: one round trip)."""
    window = settings.LOGIN_FAILURE_WINDOW
    pipe = core_redis.client().pipeline(transaction=False)
    for key in _keys(username=username, address=address):
        pipe.set(key, 0, ex=window, nx=True)
        pipe.incr(key)
    pipe.execute()


def login_succeeded(*, username: str) -> None:
    """Clears the username's failures. Not the address's: one valid account of its own must not
    let a guesser reset the count of its guesses at other accounts."""
    user_key, _ = _keys(username=username, address="")
    core_redis.client().delete(user_key)


def _throttled_message(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return ngettext(
        "Too many failed sign-in attempts. Try again in %(n)d minute.",
        "Too many failed sign-in attempts. Try again in %(n)d minutes.",
        minutes,
    ) % {"n": minutes}


class _Throttled(AuthenticationForm):
    """The check before AuthenticationForm.clean authenticates, the count after it fails."""

    retry_after: int | None = None

    def clean(self):
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if not username or not password:  # a field error already; nothing is authenticated
            return super().clean()
        address = self.request.META.get("REMOTE_ADDR", "") if self.request is not None else ""
        self.retry_after = login_retry_after(username=username, address=address)
        if self.retry_after is not None:
            raise ValidationError(_throttled_message(self.retry_after), code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            login_failed(username=username, address=address)
            raise
        login_succeeded(username=username)
        return cleaned


class LoginForm(_Throttled):
    pass


class AdminLoginForm(_Throttled, AdminAuthenticationForm):
    pass


def refused_with_429(view):
    """A login view whose form was throttled answers 429 with Retry-After, its page unchanged."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        if (
            isinstance(form, _Throttled)
            and form.is_bound
            and form.has_error(NON_FIELD_ERRORS, "throttled")
        ):
            response.status_code = 429
            response["Retry-After"] = str(form.retry_after)
        return response

    return wrapped
