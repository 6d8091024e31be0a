"""Strict readers for settings that come from the environment.

Every reader names the variable in its error, so a typo in a deployment stops
start-up with a message that says which variable is wrong and what it wants,
instead of a default silently taking its place.
"""

import os
from pathlib import Path
from typing import overload
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _fail(name: str, wanted: str, value: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"Environment variable {name} must be {wanted}; got {value!r}.")


# The overloads tell the type checker what the readers do: a value given as the default means the
# setting is never None.
@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _fail(name, "a boolean (true/false, 1/0, yes/no, on/off)", value)


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise _fail(name, "a whole number", value) from None
    if minimum is not None and number < minimum:
        raise _fail(name, f"at least {minimum}", value)
    if maximum is not None and number > maximum:
        raise _fail(name, f"at most {maximum}", value)
    return number


@overload
def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float: ...
@overload
def env_float(
    name: str, default: None, *, minimum: float | None = None, maximum: float | None = None
) -> float | None: ...
def env_float(
    name: str,
    default: float | None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise _fail(name, "a number", value) from None
    if minimum is not None and number < minimum:
        raise _fail(name, f"at least {minimum}", value)
    if maximum is not None and number > maximum:
        raise _fail(name, f"at most {maximum}", value)
    return number


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _raw(name)
    if value is None:
        return default
    if value not in choices:
        raise _fail(name, f"one of {', '.join(choices)}", value)
    return value


def env_url(name: str, *, schemes: tuple[str, ...], default: str | None = None) -> str | None:
    """A URL whose scheme is one of `schemes` and which names a host or a socket path."""
    value = _raw(name)
    if value is None:
        return default
    check_url(name, value, schemes=schemes)
    return value


def check_url(name: str, value: str, *, schemes: tuple[str, ...]) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise _fail(name, f"a URL ({'/'.join(schemes)}://…)", _redact(value)) from None
    if parts.scheme not in schemes:
        raise _fail(name, f"a URL with scheme {' or '.join(schemes)}", _redact(value))
    if not parts.hostname and "host=" not in parts.query and not parts.path.strip("/"):
        raise _fail(name, "a URL naming a host", _redact(value))


def _redact(url: str) -> str:
    """Hide a password in a URL before it goes into an error message or a log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


redact_url = _redact


def var_dir(*, create: bool = True) -> Path:
    """The folder for the gateway's own files (`VAR_DIR`, default `var/` in the checkout): the
    development secret key, engine logs, the embedded servers' data. Created if missing, unless
    `create` is off (the settings only name it)."""
    path = Path(
        os.environ.get("VAR_DIR") or Path(__file__).resolve().parent.parent / "var"
    ).resolve()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
