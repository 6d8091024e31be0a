"""What the question holds that decides where it may go (`Screening`): the personal data types in
what an engine would be sent, and a suspected prompt injection in what the user (or a tool) wrote.
Read once per request, after the knowledge base (a direct answer sends nothing to a model), with
the operator's policy (privacy.policy, held by the rules' snapshot); the rules match on it
(`routing.compiled.Context`), the plan keeps it, the request log counts it.
"""

from __future__ import annotations

from privacy.detector import types_in
from privacy.injection import suspected
from privacy.policy import Policy, Screening
from routing.events import RouteRequest


def screen(request: RouteRequest, policy: Policy) -> Screening:
    """The request's screening, read once (kept on the request: the named road and the chain ask
    again)."""
    if request.screening is None:
        request.screening = Screening(
            personal=personal_data_in(texts_sent(request), policy),
            injection=injection_in(request),
            policy=policy,
        )
        request.spent.personal_data = request.screening.personal
        request.spent.injection = request.screening.injection or ""
    return request.screening


def personal_data_in(texts: list[str], policy: Policy) -> tuple[str, ...]:
    """The personal data types in these texts (privacy.detector, with the policy's types and
    thresholds), sorted. What the client sent is read; the rule's prompt and the KB's passages,
    the operator's own words, are not."""
    if not policy.types:
        return ()
    found: set[str] = set()
    thresholds = policy.threshold_of or None
    for text in texts:
        if text:
            found |= types_in(text, types=policy.types, thresholds=thresholds)
    return tuple(sorted(found))


def texts_sent(request: RouteRequest) -> list[str]:
    """Every text of the client's an engine would read: the question, the client's system text,
    the conversation, what follows the question (tool results), a raw completion's suffix."""
    passthrough = request.passthrough
    suffix = passthrough.fields.get("suffix")
    return [
        request.text,
        request.system or "",
        *map(said, request.history),
        *map(said, passthrough.after),
        suffix if isinstance(suffix, str) else "",
    ]


def injection_in(request: RouteRequest) -> str | None:
    """A suspected injection in what the user wrote now (the question) or what a tool returned to
    the model (its results, where indirect injections hide). The client's own system text and the
    conversation before are not read: the first is the developer's, the second was read when
    it was asked."""
    texts = [request.text] + [
        said(message) for message in request.passthrough.after if message.get("role") == "tool"
    ]
    for text in texts:
        if text and (kind := suspected(text)) is not None:
            return kind
    return None


def said(message: dict) -> str:
    """A message's text as an engine would read it: its content, its text parts and the arguments
    of the tool calls it holds."""
    content = message.get("content")
    parts = [content] if isinstance(content, str) else []
    if isinstance(content, list):
        parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            parts.append(function["arguments"])
    return "\n".join(part for part in parts if isinstance(part, str))
