"""One question as an interface hands it over to a turn (`TurnRequest`), and the same question
once through the intake (`Admitted`, chat.turns.aquestion_intake)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat import services
from chat.models import ChatSession
from observability.models import RequestLog
from routing import events


@dataclass(kw_only=True)
class TurnRequest:
    """One question as an interface hands it over: who asks, what the model is asked, and where
    the turn is kept. The same for the browser's socket, the chat API and /v1."""

    user: Any
    content: str | None  # None: a regeneration, which answers the stored question again
    interface: str = RequestLog.Interface.WEB
    client: str = "web"  # what the rules match as the client (chat.models.ApiKey.client)
    source: str = ChatSession.Source.WEB  # a session's origin, for one this turn creates
    # What the model gets besides the question: a model the client named, the token ceiling and
    # temperature it asked for, its system text, and what /v1 carries as it was sent.
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str = ""
    passthrough: events.Passthrough = events.PLAIN
    # Sent with the request (/v1): the conversation, and the groups the key lookup brought. The
    # answer then needs nothing of the turn's rows and starts while they are written.
    history: list[dict] | None = None
    groups: frozenset[str] | None = None
    api_key_id: int | None = None
    # The API key's priority class at an endpoint's capacity, when staff gave it one.
    priority: str | None = None
    # Where it is kept: a session (None: a new one), nowhere (store=False, /v1 naming no
    # session), or a new version of the session's last exchange (regenerate: an answer's id;
    # edit: a question's id, replaced by `content`).
    session_id: int | None = None
    store: bool = True
    regenerate: int | None = None
    edit: int | None = None

    def __post_init__(self):
        if not self.store and (self.history is None or self.groups is None):
            raise ValueError(
                "a turn that stores nothing needs its history and groups from the caller"
            )
        if self.redo is not None and (self.history is not None or not self.store):
            raise ValueError(
                "a new version of a stored exchange reads its history from the session"
            )

    @property
    def redo(self) -> int | None:
        return self.regenerate if self.regenerate is not None else self.edit


@dataclass(frozen=True)
class Admitted:
    """A question through the intake: the process takes turns, its text is checked, it is counted
    against the user's rate limit and holds a stream slot (None: limits open in a Redis outage).
    `started`: a new version of the last exchange, started by the intake."""

    content: str | None
    slot: services.StreamSlot | None
    started: services.TurnStart | None = None
