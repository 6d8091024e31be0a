"""What makes a routing rule valid: its regex compiles in RE2 (linear time, so no pattern can stall
the event loop), its conditions can match, and its chain names live endpoints with a share. The
admin and the API refuse an invalid rule with these messages; the snapshot compiles the regexes
with the same function."""

from __future__ import annotations

import re2

from knowledge.normalize import normalize
from routing.exceptions import RuleInvalid
from routing.models import RoutingRule

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the reason goes into the admin's message, not to stderr


def regex_compile(pattern: str) -> re2._Regexp:
    """An admin's pattern in RE2, whose time is linear in the question's length: no pattern can
    stall the event loop (Python's `re` backtracks exponentially on patterns such as
    `(\\w+\\s?)+$`). RE2 has no backreferences or lookaround, and its \\w, \\d and \\b are ASCII:
    \\p{L}, \\p{Han} and \\p{N} match other scripts."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise RuleInvalid(
            {
                "regex": f"is not a valid RE2 regular expression ({reason}); RE2 has no "
                "backreferences or lookaround, and \\w, \\d, \\b are ASCII "
                "(use \\p{L}, \\p{Han}, \\p{N} for other scripts)"
            }
        ) from None


# How a rule names the traffic of an API key: by the client name staff gave the key in the admin
# (chat.ApiKey.client_name), never by the key's own name, which its user chooses and which two
# users' keys may share.
CLIENT_PREFIX = "client:"


def client_name_problem(name: str) -> str | None:
    """Why `name` cannot be a client name (on a key, after "client:" in a rule), or None."""
    if not name or len(name) > 100:
        return "must be 1 to 100 characters"
    if name != name.strip() or not name.isprintable():
        return "must not start or end with spaces or hold control characters"
    return None


def clients_problem(clients: list[str]) -> str | None:
    """Why a rule's client list cannot be, or None: each entry is "web" or "client:NAME"."""
    for entry in clients:
        if entry == "web":
            continue
        if entry.startswith("key:"):
            return (
                f"{entry!r}: a key's name is chosen by its user, so rules no longer match it; "
                f'write "{CLIENT_PREFIX}NAME" with the client name staff give the key '
                "(API keys in the admin)"
            )
        if not entry.startswith(CLIENT_PREFIX):
            return f'{entry!r}: a client is "web" or "{CLIENT_PREFIX}NAME"'
        if problem := client_name_problem(entry.removeprefix(CLIENT_PREFIX)):
            return f"{entry!r}: the client name {problem}"
    return None


def rule_validate(*, fields: dict, targets: list[dict] | None = None) -> None:
    """Refuse a rule that can never match and a chain that names inactive endpoints.

    `fields` holds the rule's fields; `targets` (when given) dicts with endpoint, position, weight.
    """
    errors: dict[str, str] = {}
    is_default = fields.get("is_default")
    conditions = (
        "keywords",
        "regex",
        "intent_examples",
        "min_length",
        "max_length",
        "clients",
        "requested_models",
        "over_budget",
        "personal_data",
        "injection",
    )
    if is_default and any(fields.get(name) for name in conditions):
        errors["is_default"] = "the default rule catches everything: remove its conditions"
    if fields.get("regex"):
        try:
            regex_compile(fields["regex"])
        except RuleInvalid as exc:
            errors.update(exc.errors)
    if fields.get("keywords") is not None and any(
        not normalize(k) for k in fields.get("keywords") or []
    ):
        errors["keywords"] = "a keyword made only of spaces or punctuation can never match"
    if fields.get("personal_data_types") and fields.get("personal_data") != "with":
        errors["personal_data_types"] = (
            'types count only with "holds personal data": choose it, or clear the types'
        )
    if problem := clients_problem(list(fields.get("clients") or [])):
        errors["clients"] = problem
    low, high = fields.get("min_length"), fields.get("max_length")
    if low is not None and high is not None and low > high:
        errors["max_length"] = f"is below min_length ({high} < {low}): the rule could never match"
    if high == 0:
        errors["max_length"] = (
            "0 characters: the rule could never match (empty questions are refused)"
        )
    if targets is not None:
        live = [t for t in targets if t.get("endpoint") is not None]
        if fields.get("action") == RoutingRule.Action.GENERATE and not live:
            errors["targets"] = "a generate rule needs at least one target"
        inactive = sorted({t["endpoint"].name for t in live if not t["endpoint"].active})
        if inactive:
            errors["targets"] = f"inactive endpoint(s) in the chain: {', '.join(inactive)}"
        if any(t.get("weight") == 0 for t in live):
            by_position: dict[int, int] = {}
            for t in live:
                by_position[t.get("position", 1)] = by_position.get(t.get("position", 1), 0) + (
                    t.get("weight") or 0
                )
            if any(total == 0 for total in by_position.values()):
                errors["targets"] = "every position needs a target with a weight above 0"
    if errors:
        raise RuleInvalid(errors)
