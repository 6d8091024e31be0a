"""The bench's users and the session cookies a browser login would give them."""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model


def bench_user(*, username: str, staff: bool = False):
    """The user `username`, created if missing, with no usable password: nobody logs in as it
    but the bench, through `session_cookie`."""
    user, created = get_user_model().objects.get_or_create(
        username=username, defaults={"is_staff": staff}
    )
    if created or user.is_staff != staff or user.has_usable_password():
        user.is_staff = staff
        user.set_unusable_password()
        user.save()
    return user


def session_cookie(*, user) -> str:
    """A `Cookie` header value with a fresh session of `user`, as the login form would store it.

    The session's auth hash is signed with this process's SECRET_KEY: a gateway accepts the
    cookie only if it runs with the same key and database.
    """
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


def bench_api_key(*, username: str, name: str) -> str:
    """A fresh `chat` key of the bench user `username` (its earlier key `name` deleted); the raw
    key."""
    from chat.apikeys import apikey_create
    from chat.models import ApiKey

    user = bench_user(username=username)
    ApiKey.objects.filter(user=user, name=name).delete()
    return apikey_create(user=user, name=name, scopes=[ApiKey.Scope.CHAT])[1]
