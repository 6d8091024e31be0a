"""Reads of conversations that are more than a lookup: a user's message, and the search over a
user's messages."""

from __future__ import annotations

import re

from django.contrib.postgres.search import SearchQueryField, SearchVectorField
from django.db.models import BooleanField, F, FloatField, Func, QuerySet, Value

from chat.exceptions import SearchInvalid, SessionNotFound
from chat.models import Message
from core.text import text_problem

SEARCH_MAX_CHARS = 200
SNIPPET_CHARS = 160

# The scripts written without spaces, as the search functions of migration 0005 split them.
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def message_get(*, user, message_id: int) -> Message:
    """The user's own message; another user's is indistinguishable from a missing one."""
    message = Message.objects.filter(pk=message_id, session__user=user).first()
    if message is None:
        raise SessionNotFound(f"You have no message {message_id}.")
    return message


class _Matches(Func):
    """`document @@ query`, a condition the GIN index `message_search` answers."""

    arg_joiner = " @@ "
    template = "(%(expressions)s)"
    output_field = BooleanField()


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


def messages_search(*, user, query: str) -> QuerySet[Message]:
    """The user's own messages matching `query` (every word; for Chinese, Japanese and Korean
    every pair of characters), best first, then newest first, with their session. Only the
    current versions: a search lists what the conversation says now. `query` as
    `search_query_validate` returned it."""
    document = Func(F("content"), function="chat_search_document", output_field=SearchVectorField())
    wanted = Func(Value(query), function="chat_search_query", output_field=SearchQueryField())
    return (
        Message.objects.filter(_Matches(document, wanted), session__user=user, superseded=False)
        .exclude(status=Message.Status.STREAMING)
        .select_related("session")
        .annotate(rank=Func(document, wanted, function="ts_rank", output_field=FloatField()))
        .order_by("-rank", "-created_at", "-pk")
    )


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
