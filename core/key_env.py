"""Which environment variables may hold a key the gateway sends out.

An endpoint's or an embedding model's `api_key_env` is written in the admin, and the variable's
value leaves as a Bearer token for the row's URL. So a row may name only a variable made for
that: one whose name starts with ENDPOINT_KEY_ENV_PREFIX (`GW_KEY_`), one the operator listed
in ENDPOINT_KEY_ENV_NAMES, or the one EXTERNAL_LLM_API_KEY_ENV, KB_EMBEDDING_API_KEY_ENV or
KB_RERANK_API_KEY_ENV names;
never one of the gateway's own secrets, whatever the lists say.
"""

from __future__ import annotations

import re

from django.conf import settings

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The gateway's own secrets and connection strings: never a key for a row's URL, never an engine's.
GATEWAY_SECRETS = frozenset({"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"})


def key_env_problem(name: str) -> str | None:
    """Why `name` may not hold a key sent to a row's URL, or None when it may."""
    if not name:
        return None
    if not ENV_NAME.match(name):
        return f"{name!r} is not the name of an environment variable"
    prefix = settings.ENDPOINT_KEY_ENV_PREFIX
    allowed = {
        *settings.ENDPOINT_KEY_ENV_NAMES,
        settings.EXTERNAL_LLM_API_KEY_ENV,
        settings.KB_EMBEDDING_API_KEY_ENV or "",
        settings.KB_RERANK_API_KEY_ENV or "",
    } - {""}
    if name not in GATEWAY_SECRETS and (name.startswith(prefix) or name in allowed):
        return None
    return (
        f"{name} may not hold an endpoint key: its value would be sent to this row's URL. "
        f"Put the key in a variable whose name starts with {prefix} "
        f"(e.g. {prefix}{_suggest(name)}), "
        "or have the operator list the name in ENDPOINT_KEY_ENV_NAMES."
    )


def _suggest(name: str) -> str:
    return re.sub(r"[^A-Z0-9_]", "_", name.upper()) or "PROVIDER"
