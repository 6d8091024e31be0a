"""Searching one's own messages: PostgreSQL full-text search, Chinese included, one user's
sessions only, with a snippet and the ids to open the session at the message."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.models import ChatSession, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def chats(alice, bob):
    """Alice's two chats, one in Chinese, and Bob's chat about the same things."""
    trip = ChatSession.objects.create(user=alice, title="Trip")
    password = ChatSession.objects.create(user=alice, title="密码")
    theirs = ChatSession.objects.create(user=bob, title="Bob's")
    messages = {
        "trip_question": Message.objects.create(
            session=trip, role="user", content="Which trains run to the Alps in winter?"
        ),
        "trip_answer": Message.objects.create(
            session=trip,
            role="assistant",
            content="Night **trains** leave Paris for the ALPS twice a week. " + "More. " * 60,
        ),
        "zh_question": Message.objects.create(
            session=password, role="user", content="我忘记了密码，怎么重置密码？"
        ),
        "zh_answer": Message.objects.create(
            session=password, role="assistant", content="在登录页点击“忘记密码”即可重置。"
        ),
        "bobs": Message.objects.create(
            session=theirs, role="user", content="Trains to the Alps? 重置密码"
        ),
    }
    return messages


def search(api, q, **params):
    return api.get("/api/chat/search", {"q": q, **params})


def test_words_are_found_in_any_case_in_the_users_own_messages_best_first(api, chats):
    response = search(api, "alps TRAINS")

    assert response.status_code == 200
    hits = response.json()["results"]
    assert {hit["message_id"] for hit in hits} == {
        chats["trip_question"].pk,
        chats["trip_answer"].pk,
    }
    answer = next(hit for hit in hits if hit["role"] == "assistant")
    assert answer["session_id"] == chats["trip_answer"].session_id
    assert answer["session_title"] == "Trip"
    assert answer["snippet"].startswith("Night **trains** leave Paris for the ALPS")
    assert answer["snippet"].endswith("…") and len(answer["snippet"]) <= 170
    assert search(api, "alps submarine").json()["results"] == []  # every word must be there


@pytest.mark.parametrize(
    ("q", "found"),
    [
        ("密码", {"zh_question", "zh_answer"}),
        ("重置", {"zh_question", "zh_answer"}),
        ("重置密码", {"zh_question"}),
        ("忘记密码", {"zh_answer"}),  # the question has 忘记了密码: no 记密
        ("码", {"zh_question", "zh_answer"}),
        ("登录", {"zh_answer"}),
        ("密重", set()),  # both characters are there, never side by side
        ("火车", set()),
    ],
)
def test_chinese_is_found_by_its_words_without_spaces(api, chats, q, found):
    hits = search(api, q).json()["results"]

    assert {hit["message_id"] for hit in hits} == {chats[name].pk for name in found}
    for hit in hits:
        assert q[:2] in hit["snippet"] or q[-2:] in hit["snippet"]


def test_another_users_messages_are_never_found(bob_api, api, chats, alice):
    hits = search(bob_api, "重置密码").json()["results"]
    assert [hit["message_id"] for hit in hits] == [chats["bobs"].pk]
    assert [hit["message_id"] for hit in search(bob_api, "Alps").json()["results"]] == [
        chats["bobs"].pk
    ]
    assert chats["bobs"].pk not in {
        hit["message_id"] for hit in search(api, "Alps").json()["results"]
    }


def test_superseded_versions_and_answers_being_written_are_not_listed(api, chats):
    chats["zh_answer"].superseded = True
    chats["zh_answer"].save()
    streaming = Message.objects.create(
        session=chats["zh_answer"].session, role="assistant", content="", status="streaming"
    )
    Message.objects.filter(pk=streaming.pk).update(content="重置密码 half written")

    hits = search(api, "重置").json()["results"]

    assert [hit["message_id"] for hit in hits] == [chats["zh_question"].pk]


def test_results_come_in_pages(api, alice):
    session = ChatSession.objects.create(user=alice, title="Many")
    for n in range(25):
        Message.objects.create(session=session, role="user", content=f"kettle question {n}")

    first = search(api, "kettle").json()
    second = search(api, "kettle", page=2).json()

    assert first["count"] == 25 and len(first["results"]) == 20 and first["next"]
    assert len(second["results"]) == 5 and second["next"] is None
    assert search(api, "kettle", page_size=5).json()["next"]


@pytest.mark.parametrize(
    ("q", "message"),
    [
        ("", "Type something to search for."),
        ("   ", "Type something to search for."),
        ("x" * 201, "The search has 201 characters; the limit is 200."),
        ("nul\x00byte", "The search contains a NUL character (U+0000) at character 3."),
    ],
)
def test_an_empty_too_long_or_broken_query_is_a_400_with_a_message(api, chats, q, message):
    response = search(api, q)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_search"
    assert response.json()["error"]["message"] == message


def test_a_query_without_any_word_finds_nothing(api, chats):
    response = search(api, "!!! ，。")
    assert response.status_code == 200 and response.json()["results"] == []


def test_the_search_needs_a_login(client):
    assert client.get("/api/chat/search", {"q": "alps"}).status_code in (401, 403)


def test_a_search_reads_only_the_users_own_messages(api, chats, alice, bob):
    """Bob writes "Alps" in hundreds of messages; Alice's search for it reads her own messages
    and no others: the statements that match (those calling chat_search_query), as the endpoint
    ran them, explained with their row counts. With sequential scans and nested loops off,
    PostgreSQL plans as it may on tables of real size (joining the matches of a common word to
    the user's sessions, as it did through the GIN index): the user's filter must be a condition
    of the messages' own scan to keep Bob's rows unread whatever the join."""
    theirs = ChatSession.objects.create(user=bob, title="Bob's trips")
    Message.objects.bulk_create(
        Message(session=theirs, role="user", content=f"Alps by night train, take {n}")
        for n in range(300)
    )
    mine = Message.objects.filter(session__user=alice).count()

    with CaptureQueriesContext(connection) as queries:
        response = search(api, "alps")

    assert {hit["message_id"] for hit in response.json()["results"]} == {
        chats["trip_question"].pk,
        chats["trip_answer"].pk,
    }
    matching = [q["sql"] for q in queries.captured_queries if "chat_search_query" in q["sql"]]
    assert matching
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_nestloop = off")
        for sql in matching:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0][0]["Plan"]
            assert 0 < _rows_read(plan, Message._meta.db_table) <= mine, plan


def _rows_read(node: dict, table: str) -> float:
    """Rows the plan's scans of `table` read: those they returned and those their conditions
    removed, over every loop."""
    read = 0.0
    if node.get("Relation Name") == table:
        read += node["Actual Loops"] * (
            node["Actual Rows"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
    return read + sum(_rows_read(child, table) for child in node.get("Plans", ()))
