"""Reads of conversations: a user's sessions, messages and API keys, a finished turn's two
messages, and the search over a user's messages."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from chat.exceptions import SearchInvalid, SessionNotFound
from chat.models import ApiKey, ChatSession, Message
from core.text import text_problem

SEARCH_MAX_CHARS = 200
SNIPPET_CHARS = 160

# The scripts written without spaces, as the search functions of migration 0005 split them.
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def sessions_list(*, user):
    """The user's sessions, the last one used first."""
    return ChatSession.objects.filter(user=user).order_by("-updated_at", "-pk")


def session_get(*, user, session_id: int) -> ChatSession:
    """The user's own session; another user's is indistinguishable from a missing one."""
    session = ChatSession.objects.filter(pk=session_id, user=user).first()
    if session is None:
        raise SessionNotFound(f"No chat session {session_id}.")
    return session


def session_messages(*, session: ChatSession):
    """The conversation, oldest first (its first 1000 messages)."""
    return session.messages.order_by("created_at", "pk")[:1000]


def turn_messages(*, message_id: int) -> tuple[Message, Message | None]:
    """A stored answer (with its session) and the question it answers."""
    assistant = Message.objects.select_related("session").get(pk=message_id)
    user_message = (
        assistant.session.messages.filter(role="user", pk__lt=assistant.pk).order_by("pk").last()
    )
    return assistant, user_message


def apikeys_list(*, user):
    """The user's API keys, the newest first (revoked ones too)."""
    return ApiKey.objects.filter(user=user).order_by("-created_at")


def apikey_get(*, user, key_id: int) -> ApiKey | None:
    """The user's own API key, or None (another user's too)."""
    return ApiKey.objects.filter(pk=key_id, user=user).first()


def message_get(*, user, message_id: int) -> Message:
    """The user's own message; another user's is indistinguishable from a missing one."""
    message = Message.objects.filter(pk=message_id, session__user=user).first()
    if message is None:
        raise SessionNotFound(f"You have no message {message_id}.")
    return message


def search_query_validate(query) -> str:
    if not isinstance(query, str) or not query.strip():
        raise SearchInvalid("Type something to search for.", fields={"q": "must not be empty"})
    query = " ".join(query.split())
    if len(query) > SEARCH_MAX_CHARS:
        raise SearchInvalid(
            f"The search has {len(query)} characters; the limit is {SEARCH_MAX_CHARS}.",
            fields={"q": f"at most {SEARCH_MAX_CHARS} characters"},
        )
    if (problem := text_problem(query)) is not None:
        raise SearchInvalid(f"The search {problem}.", fields={"q": problem})
    return query


# The user's matches, best first. The user's messages are found first, by their sessions (an
# index condition on the messages' (session, created_at) index), and only they are matched: a
# search costs what the searching user's own messages cost, never a scan of every user's matches
# of a common word. Each one's document is made once, for the match and the rank alike: OFFSET 0
# keeps the lateral subquery a step of its own, which PostgreSQL would otherwise fold into the
# query, the expression written (and computed) twice.
_SEARCH_SQL = (
    f"SELECT m.id FROM {Message._meta.db_table} m "  # noqa: S608 - _meta's names; values are parameters
    "CROSS JOIN LATERAL (SELECT chat_search_document(m.content) AS document OFFSET 0) d "
    "WHERE m.session_id = ANY(ARRAY("
    f"SELECT id FROM {ChatSession._meta.db_table} WHERE user_id = %(user)s)) "
    "AND NOT m.superseded AND m.status <> %(streaming)s "
    "AND d.document @@ chat_search_query(%(query)s) "
    "ORDER BY ts_rank(d.document, chat_search_query(%(query)s)) DESC, "
    "m.created_at DESC, m.id DESC"
)

_HITS_SQL = (
    "SELECT m.id, m.session_id, s.title, m.role, m.content, m.created_at "  # noqa: S608 - _meta's names; values are parameters
    f"FROM {Message._meta.db_table} m JOIN {ChatSession._meta.db_table} s ON s.id = m.session_id "
    "WHERE m.id = ANY(%(ids)s) AND s.user_id = %(user)s"
)


@dataclass(frozen=True)
class SearchHit:
    message_id: int
    session_id: int
    session_title: str
    role: str
    content: str
    created_at: datetime


class SearchHits:
    """The hits of one search, best first, read as Django's Paginator reads a list (`count()`,
    then a slice): the matching runs once, for the ids of every hit; a page's rows are then
    read by id."""

    def __init__(self, *, user_id: int, query: str) -> None:
        self.user_id = user_id
        self.query = query
        self._ids: list[int] | None = None

    def ids(self) -> list[int]:
        if self._ids is None:
            with connection.cursor() as cursor:
                cursor.execute(
                    _SEARCH_SQL,
                    {
                        "user": self.user_id,
                        "query": self.query,
                        "streaming": Message.Status.STREAMING.value,
                    },
                )
                self._ids = [row[0] for row in cursor.fetchall()]
        return self._ids

    def count(self) -> int:
        return len(self.ids())

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, page: slice) -> list[SearchHit]:
        ids = self.ids()[page]
        if not ids:
            return []
        with connection.cursor() as cursor:
            cursor.execute(_HITS_SQL, {"ids": ids, "user": self.user_id})
            rows = {row[0]: SearchHit(*row) for row in cursor.fetchall()}
        return [rows[pk] for pk in ids if pk in rows]


def messages_search(*, user, query: str) -> SearchHits:
    """The user's own messages matching `query` (every word; for Chinese, Japanese and Korean
    every pair of characters), best first, then newest first, with their session. Only the
    current versions: a search lists what the conversation says now. `query` as
    `search_query_validate` returned it."""
    return SearchHits(user_id=user.pk, query=query)


def search_snippet(content: str, query: str) -> str:
    """A line of `content` around the first place `query` is found: the whole query, else the
    first of its words (or pairs of Chinese characters) in the text. Plain text; the page marks
    the query in it."""
    text = " ".join(content.split())
    lowered = text.lower()
    at = lowered.find(query.lower())
    if at < 0:
        terms = [word.lower() for word in query.split()]
        for run in _CJK_RUN.findall(query):
            terms += [run[i : i + 2] for i in range(max(1, len(run) - 1))]
        found = [at for at in (lowered.find(term) for term in terms) if at >= 0]
        at = min(found, default=0)
    start = max(0, at - SNIPPET_CHARS // 3)
    end = min(len(text), start + SNIPPET_CHARS)
    return ("…" if start > 0 else "") + text[start:end] + ("…" if end < len(text) else "")
