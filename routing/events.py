"""What the pipeline says: the request it takes and the events it yields, the same for every
interface (`route`, `token`..., then `done` or `error`), and what of them a user may read.

Each event is a small dataclass; `Event.as_dict` is its wire form, with or without the operator's
details (`why`, the endpoints passed over), which only staff with the rules' view permission see.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from inference_ops.client import Finish
from inference_ops.exceptions import EngineError
from knowledge.verdict import DirectAnswer
from privacy.policy import Screening
from routing.compiled import Target
from spend.ledger import Standing


@dataclass(frozen=True)
class Passthrough:
    """What a /v1 client sent beyond its question's text, carried to the engine as it was sent
    (chat.openai_api.schema reads it; inference_ops.openai_fields says who takes which field)."""

    # The last user message as sent (its content parts), None when the conversation has none.
    question: dict | None = None
    # The messages after it: the assistant's tool calls, their results, a prefill.
    after: tuple[dict, ...] = ()
    # The client's other fields (tools, response_format, stop, logprobs, n, ...), as sent.
    fields: Mapping[str, object] = field(default_factory=dict)
    max_tokens_field: str = "max_tokens"  # or max_completion_tokens, as the client named it
    # The fields (or message parts) only some engine kinds take, with those kinds.
    limited: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Why a stored text answer would not satisfy the request; None when it would.
    not_plain: str | None = None
    features: tuple[str, ...] = ()  # what it asks beyond text, for the request log
    choices: int = 1  # n


PLAIN = Passthrough()


@dataclass
class RouteRequest:
    """One question on its way from an interface to the engine: the text the rules and the KB
    read, the conversation, who asks, and what else the client sent (`passthrough`)."""

    text: str
    history: list[dict] = field(default_factory=list)
    user_id: int | None = None
    groups: frozenset[str] = frozenset()
    client: str = "web"
    # a model name from /v1/models forces that target; None or "auto" routes
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    # The client's own instructions (e.g. a system message sent to /v1), added to the rule's.
    system: str = ""
    # False for a turn that stores nothing (a /v1 call naming no session): it leaves no KB record.
    store: bool = True
    # The request's key: its request-log row, its KB record (hit or miss), its chat message and
    # the user's feedback name the same answer by it. None: the KB keeps no record of the turn.
    key: uuid.UUID | None = None
    # The API key the request came with: its limits apply (spend), besides its user's and groups'.
    api_key_id: int | None = None
    # What it used of a model, filled in by the pipeline as the answer ends (the request log's).
    spent: Spent = field(default_factory=lambda: Spent())
    passthrough: Passthrough = PLAIN
    # The /v1 API asked (chat, completions, embeddings): a target that does not serve it is
    # passed over.
    api: str = "chat"
    # Its priority class at an endpoint's capacity (inference_ops.admission.CLASSES); None: the
    # interface's default (interactive for people, api for an API key).
    priority: str | None = None
    # What it holds that decides where it may go (routing.screening.screen): read once, after the
    # knowledge base; None until then.
    screening: Screening | None = None


@dataclass
class Spent:
    """Tokens in and out and their cost: as the engine reported them, or, for a stream cut short
    or an engine that reports no usage, as the gateway estimates what was produced. None: no model
    ran."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    tool_calls: int = 0  # the tool calls the model made
    waited: float = 0.0  # seconds spent waiting for room at an endpoint's capacity
    priority: str = ""  # its class there (inference_ops.admission.CLASSES); "": no model asked
    # What the screening found (routing.screening), and what came of it, for the request log and
    # the metrics: the personal data types (never the values) and where they went: "local" (the
    # local road answered), "redacted" (an external one, placeholders for the data), "sent" (an
    # external endpoint opted in to the types), "refused" (no target that may take them
    # answered); a suspected prompt injection's kind and its action: "logged" | "routed" |
    # "refused".
    personal_data: tuple[str, ...] = ()
    personal_data_action: str = ""
    injection: str = ""
    injection_action: str = ""


@dataclass(frozen=True, slots=True)
class KbLookup:
    """The KB check's verdict in a few numbers, for the request log and the metrics."""

    method: str  # exact | vector | none | follow_up
    hit: bool
    entry_id: int | None  # the entry that answered, or the best candidate that did not
    score: float | None

    @classmethod
    def of(cls, direct: DirectAnswer) -> KbLookup:
        return cls(
            method=direct.method,
            hit=direct.hit,
            entry_id=direct.entry.pk if direct.entry else None,
            score=None if direct.score is None else round(direct.score, 4),
        )


# What the request log and the metrics read of an event, but the client's frame leaves out: the
# KB's scores and the endpoints that failed are the operators' business.
_NOT_FOR_CLIENTS = ("kb", "fell_back_from", "standing", "retried", "skipped_chunks", "context")


@dataclass(kw_only=True)
class Event:
    type: str

    def as_dict(self, *, details: bool = False) -> dict:
        """The event as a client's frame. `details`: for the staff who may read the routing rules;
        everyone else reads a route's plain reason and an engine failure's plain message."""
        # The fields as they are (no deep copy like dataclasses.asdict): one per token frame.
        fields = dict(self.__dict__)
        for name in _NOT_FOR_CLIENTS:
            fields.pop(name, None)
        return fields


@dataclass(kw_only=True)
class Route(Event):
    road: str  # kb | local | external
    rule: str | None
    target: str | None
    # The details: KB scores and thresholds, the rule's conditions, the endpoints passed over and
    # why.
    why: str
    reason: str  # what a user reads instead: the road and a plain reason
    # the engine's time up to its first token, as this gateway saw it
    engine_ms: float | None = None
    # the caller's tightest request and token limits after this request (/v1's x-ratelimit-*)
    standing: Standing | None = None
    # A route in the middle of an answer: the endpoint whose stream broke after its first tokens,
    # the answer going on here from where it was cut.
    continued_from: str | None = None
    # The question's KB passages as the engine got them (routing.prompt.passages_block; "" for
    # none): what a stored conversation replays the question with on later turns. Not for clients.
    context: str = ""
    type: str = "route"

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        reason = fields.pop("reason")
        if not details:
            fields["why"] = reason
        if fields["continued_from"] is None:  # said only by a continuation's route
            del fields["continued_from"]
        return fields


@dataclass(kw_only=True)
class Token(Event):
    text: str  # the first choice's content
    # The engine's choice deltas as it sent them (tool calls, logprobs, several choices, a
    # refusal), without their finish reasons; None when the chunks held only the first choice's
    # text.
    choices: list[dict] | None = None
    type: str = "token"

    @property
    def says_something(self) -> bool:
        """False for a token whose text is held back (a redacted answer's placeholder begun)."""
        return bool(self.text) or self.choices is not None

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        if fields["choices"] is None:
            del fields["choices"]
        return fields


@dataclass(kw_only=True)
class Done(Event):
    road: str
    rule: str | None
    target: str | None
    ttft_ms: float | None
    latency_ms: float
    usage: dict | None
    finish_reason: str
    citations: list[dict]
    kb_entry_id: int | None = None  # the entry that answered (the KB road)
    # the engine's time, request to last byte; None when no engine ran
    engine_ms: float | None = None
    kb: KbLookup | None = None  # what the KB check found, also when it did not answer
    fell_back_from: tuple[
        str, ...
    ] = ()  # endpoints passed over (failed or resting) before the answer
    # the gateway's own time, set by the interface that times the request
    overhead_ms: float | None = None
    # every choice's finish reason by its index, when the engine answered several
    finish_reasons: dict[int, str] | None = None
    system_fingerprint: str | None = None
    # same-target retries before the first token: (endpoint, the failure's kind, seconds waited)
    retried: tuple[tuple[str, str, float], ...] = ()
    skipped_chunks: int = 0  # unreadable chunks of the engine's stream passed over
    # The endpoints that continued the answer after a stream broke mid-answer, in order.
    continued: tuple[str, ...] = ()
    type: str = "done"

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        if not fields["continued"]:  # said only by an answer continued after a cut
            del fields["continued"]
        return fields


@dataclass(kw_only=True)
class Error(Event):
    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None  # seconds until a target may answer again, when one said so
    partial: bool = False  # tokens were already sent
    road: str | None = None
    rule: str | None = None
    target: str | None = None
    kb: KbLookup | None = None
    fell_back_from: tuple[str, ...] = ()
    standing: Standing | None = None  # a limit's refusal: the caller's limits (x-ratelimit-*)
    param: str | None = None  # the request field at fault, when one is
    retried: tuple[tuple[str, str, float], ...] = ()  # as Done's
    type: str = "error"

    def as_dict(self, *, details: bool = False) -> dict:
        fields = super().as_dict()
        if not details:
            fields["message"] = message_for_users(self.code, self.message, partial=self.partial)
        return fields


# Errors whose message names endpoints, hosts, status lines or the attempts before: an engine's
# failure (EngineError.kind), or no target left to try.
# A content-policy refusal is the provider's reason, about the request: the user reads it.
_OPERATORS_FAILURES = (frozenset(EngineError.KINDS) - {"content_filter"}) | {
    "unavailable",
    "no_target",
}


def message_for_users(code: str, message: str, *, partial: bool) -> str:
    """An error's message as a user reads it: the message itself when it is about the request (too
    long, an unknown model, …), a plain one when it is about the operator's engines."""
    if code not in _OPERATORS_FAILURES:
        return message
    if code == "busy":
        return "Every model that could answer is busy right now; try again in a few seconds."
    return (
        "The model failed while answering."
        if partial
        else "No model could answer this question right now."
    )


def usage_of(finish: Finish) -> dict | None:
    """The engine's usage as OpenAI's: the counts, and its details where it gave them (cached
    prompt tokens, reasoning tokens)."""
    if finish.usage is None:
        return None
    prompt, completion = finish.usage.prompt_tokens, finish.usage.completion_tokens
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    usage.update(finish.usage.details)
    return usage


def route_event(
    target: Target,
    rule: str | None,
    why: str,
    attempts: list[str],
    dropped: int,
    *,
    named: bool,
    engine_ms: float,
    standing: Standing | None = None,
    retries: str = "",
    context: str = "",
) -> Route:
    """The `route` event of a generated answer: the road taken, with the details for operators
    (the rule's reasons, the fallbacks, history left out) and a plain reason for users."""
    notes = [why]
    reason = f"answered by the {target.road} model" + (" you named" if named else "")
    if retries:
        notes.append("retried " + retries)
    if attempts:
        notes.append("fell back after " + "; ".join(attempts))
        reason += ", as a fallback: the first choice could not answer"
    if dropped:
        notes.append(f"{dropped} oldest history message(s) left out to fit the context window")
        reason += (
            "; the oldest messages of the conversation were left out to fit the model's "
            "context window"
        )
    return Route(
        road=target.road,
        rule=rule,
        target=target.endpoint,
        why=". ".join(notes),
        reason=reason,
        engine_ms=engine_ms,
        standing=standing,
        context=context,
    )
