"""The request log in the admin: read-only rows filtered by time first, by road, target, status
and the rest, searched, and exported as CSV; counted exactly only when that is quick."""

import csv
import io
import re
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from chat.apikeys import apikey_create
from knowledge.services.entries import entry_create
from observability.admin import CountOrEstimatePaginator
from observability.export import EXPORT_COLUMNS
from observability.models import RequestLog
from observability.requestlog import RequestRecord, partition_ensure, request_flush, request_note
from tests.support.personas import client_of

LIST = "/admin/observability/requestlog/"
EXPORT = "/admin/observability/requestlog/export.csv"

# Each test starts from an empty log and writes its rows itself (conftest.rows_by_hand).
pytestmark = pytest.mark.usefixtures("rows_by_hand")


def record(*, ago: timedelta = timedelta(minutes=2), **fields) -> RequestRecord:
    """A request as the request path records it: a local answer `ago` before now, unless told."""
    values = dict(
        at=timezone.now() - ago,
        interface="web",
        user_id=None,
        api_key_id=None,
        session_id=None,
        road="local",
        rule="default",
        target="local",
        status="complete",
        error_code="",
        ttft_ms=120.0,
        latency_ms=900.0,
        overhead_ms=8.0,
        prompt_tokens=40,
        completion_tokens=60,
        cost=0.0007,
        kb_method="none",
        kb_hit=False,
        kb_entry_id=None,
        kb_score=None,
    )
    values.update(fields)
    return RequestRecord(**values)


def write(*records: RequestRecord) -> list[RequestRecord]:
    """Through the log's own writer. A test's transaction rolls its partitions back with it, so
    each test makes the days it writes to."""
    for day in {r.at.astimezone(UTC).date() for r in records}:
        partition_ensure(day)
    for r in records:
        request_note(r)
    assert request_flush() == len(records)
    return list(records)


@pytest.fixture
def laptop(alice):
    """Alice's API key."""
    return apikey_create(user=alice, name="laptop", scopes=["chat"])[0]


def column(response, name) -> list[str]:
    """The text of one column of the changelist, row by row ("-" where it is empty)."""
    return re.findall(rf'<td class="field-{name}">(.*?)</td>', response.content.decode())


def result_rows(response) -> list[str]:
    """The changelist's rows, one string of HTML each."""
    html = response.content.decode()
    body = html[
        html.index('<table id="result_list">') : html.index(
            "</table>", html.index('<table id="result_list">')
        )
    ]
    return body.split("<tr")[2:]  # the header row first


def exported(response) -> list[dict]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.django_db
def test_a_row_lists_what_its_user_saw(operator_client, alice, laptop):
    entry = entry_create(
        question="How do I reset my password?", answer="Use the link.", embed="none"
    )
    write(
        record(
            interface="v1",
            user_id=alice.pk,
            api_key_id=laptop.pk,
            road="kb",
            rule="faq",
            target=f"KB#{entry.pk}",
            ttft_ms=3.5,
            latency_ms=4.5,
            overhead_ms=4.5,
            prompt_tokens=None,
            completion_tokens=None,
            kb_method="exact",
            kb_hit=True,
            kb_entry_id=entry.pk,
            kb_score=1.0,
        )
    )
    response = operator_client.get(LIST)
    assert response.status_code == 200
    [row] = result_rows(response)
    assert f'href="/admin/auth/user/{alice.pk}/change/">alice</a>' in row
    assert f"laptop ({laptop.prefix}…)" in row
    assert f'href="/admin/knowledge/entry/{entry.pk}/change/">KB#{entry.pk}</a>' in row
    for shown in (
        "/v1 API",
        ">kb<",
        ">faq<",
        f">KB#{entry.pk}<",
        ">complete<",
        ">3.5<",
        ">4.5<",
        ">1.0<",
    ):
        assert shown in row
    html = response.content.decode()
    for heading in (
        "Time",
        "Interface",
        "User",
        "API key",
        "Road",
        "Rule",
        "Target",
        "Status",
        "Error code",
        "TTFT ms",
        "Latency ms",
        "Gateway ms",
        "Tokens in",
        "Tokens out",
        "KB entry",
        "KB score",
        "Fallbacks",
    ):
        assert f">{heading}</" in html, heading


@pytest.mark.django_db
def test_the_list_filters_by_road_target_status_interface_and_kb_answer(operator_client):
    write(
        record(road="kb", target="KB#1", kb_method="exact", kb_hit=True, rule="kb-rule"),
        record(road="local", target="local", rule="local-rule"),
        record(
            road="external",
            target="external",
            status="failed",
            error_code="engine_timeout",
            rule="external-rule",
            interface="v1",
        ),
        record(
            road="", target="", rule="", status="failed", error_code="no_target", interface="api"
        ),
    )

    def rules(**query):
        return sorted(column(operator_client.get(LIST, query), "rule"))

    assert rules() == ["-", "external-rule", "kb-rule", "local-rule"]
    assert rules(road="kb") == ["kb-rule"]
    assert rules(road="none") == ["-"]
    assert rules(target="external") == ["external-rule"]
    assert rules(status__exact="failed") == ["-", "external-rule"]
    assert rules(status__exact="failed", interface__exact="v1") == ["external-rule"]
    assert rules(kb_hit__exact="1") == ["kb-rule"]


@pytest.mark.django_db
def test_the_list_shows_and_filters_the_api_each_request_called(operator_client):
    write(
        record(rule="chat-rule"),
        record(rule="completion-rule", interface="v1", api="completions"),
        record(rule="embedding-rule", interface="v1", api="embeddings", completion_tokens=0),
    )
    response = operator_client.get(LIST, {"api__exact": "embeddings"})
    assert column(response, "rule") == ["embedding-rule"]
    assert ">API</" in response.content.decode()
    assert column(operator_client.get(LIST, {"api__exact": "completions"}), "api") == [
        "completions"
    ]
    assert sorted(column(operator_client.get(LIST), "api")) == ["chat", "completions", "embeddings"]


@pytest.mark.django_db
def test_the_list_shows_and_filters_what_the_screening_found(operator_client):
    write(
        record(rule="clean"),
        record(rule="kept-local", personal_data="email phone", personal_data_action="local"),
        record(rule="redacted", personal_data="phone", personal_data_action="redacted"),
        record(
            rule="refused",
            status="failed",
            error_code="prompt_injection",
            injection="role_override",
            injection_action="refused",
        ),
    )

    def rules(**query):
        return sorted(column(operator_client.get(LIST, query), "rule"))

    assert rules(personal_data="phone") == ["kept-local", "redacted"]
    assert rules(personal_data="email") == ["kept-local"]
    assert rules(personal_data_action__exact="redacted") == ["redacted"]
    assert rules(injection="role_override") == ["refused"]
    assert rules(injection_action__exact="refused") == ["refused"]
    assert rules(personal_data="not-a-type") == ["clean", "kept-local", "redacted", "refused"]
    response = operator_client.get(LIST, {"personal_data": "email"})
    assert column(response, "personal_data") == ["email phone"]
    assert column(response, "personal_data_action") == ["answered locally"]
    html = response.content.decode()
    for heading in ("Personal data", "Personal data action", "Injection", "Injection action"):
        assert f">{heading}</" in html, heading

    pk = RequestLog.objects.get(rule="refused").pk
    detail = operator_client.get(f"{LIST}{pk}/change/").content.decode()
    assert "role_override" in detail and "Injection action" in detail


@pytest.mark.django_db
def test_the_list_shows_the_last_day_unless_asked_for_another_period(operator_client):
    now = timezone.localtime()
    write(
        record(rule="minutes-ago", ago=timedelta(minutes=10)),
        record(rule="hours-ago", ago=timedelta(hours=3)),
        record(rule="days-ago", ago=timedelta(days=3)),
        record(rule="weeks-ago", ago=timedelta(days=20)),
    )

    def rules(**query):
        return set(column(operator_client.get(LIST, query), "rule"))

    assert rules() == {"minutes-ago", "hours-ago"}
    assert rules(period="hour") == {"minutes-ago"}
    assert rules(period="week") == {"minutes-ago", "hours-ago", "days-ago"}
    assert rules(period="all") == {"minutes-ago", "hours-ago", "days-ago", "weeks-ago"}
    three_days_ago = (now - timedelta(days=3)).date()
    assert rules(since=three_days_ago.isoformat(), until=three_days_ago.isoformat()) == {"days-ago"}
    assert rules(since=(now - timedelta(days=30)).date().isoformat()) == {
        "minutes-ago",
        "hours-ago",
        "days-ago",
        "weeks-ago",
    }


@pytest.mark.django_db
def test_a_date_that_is_not_a_date_is_ignored_and_said_so(operator_client):
    write(record(rule="recent"))
    response = operator_client.get(LIST, {"since": "last tuesday"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "“last tuesday” is not a date (YYYY-MM-DD)" in html
    assert column(response, "rule") == ["recent"]


@pytest.mark.django_db
def test_search_finds_rows_by_rule_target_error_code_and_user_name(operator_client, alice, bob):
    write(
        record(rule="billing", user_id=alice.pk),
        record(rule="refunds", target="gpu-box", user_id=bob.pk),
        record(rule="other", status="failed", error_code="rate_limited"),
    )

    def found(term):
        return set(column(operator_client.get(LIST, {"q": term}), "rule"))

    assert found("bill") == {"billing"}
    assert found("gpu-box") == {"refunds"}
    assert found("rate_lim") == {"other"}
    assert found("alice") == {"billing"}


@pytest.mark.django_db
def test_the_csv_export_holds_the_filtered_rows_with_every_column(operator_client, alice, laptop):
    kept = write(
        record(
            road="external",
            target="external",
            status="failed",
            error_code="engine_timeout",
            user_id=alice.pk,
            api_key_id=laptop.pk,
            ttft_ms=None,
            latency_ms=2500.5,
            overhead_ms=None,
            prompt_tokens=None,
            completion_tokens=None,
            cost=None,
            fell_back_from=("local",),
            retried=(("local", "server_error", 0.125), ("local", "connect", 0.25)),
            interface="v1",
            api="completions",
            personal_data="phone",
            personal_data_action="sent",  # the external endpoint may receive phone numbers
        )
    )[0]
    write(
        record(road="external", target="external", status="complete"),
        record(road="local", status="failed"),
        record(road="external", status="failed", ago=timedelta(days=2)),
    )
    page = operator_client.get(
        LIST, {"road": "external", "status__exact": "failed"}
    ).content.decode()
    assert f'href="{EXPORT}?road=external&amp;status__exact=failed"' in page

    response = operator_client.get(EXPORT, {"road": "external", "status__exact": "failed"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="request-log-')
    [row] = exported(response)
    assert list(row) == [heading for heading, _ in EXPORT_COLUMNS]
    assert row == {
        "time": kept.at.astimezone(UTC).isoformat(),
        "interface": "v1",
        "api": "completions",
        "user_id": str(alice.pk),
        "user": "alice",
        "api_key_id": str(laptop.pk),
        "api_key": "laptop",
        "session_id": "",
        "road": "external",
        "rule": "default",
        "target": "external",
        "status": "failed",
        "error_code": "engine_timeout",
        "ttft_ms": "",
        "latency_ms": "2500.5",
        "overhead_ms": "",
        "wait_ms": "",
        "prompt_tokens": "",
        "completion_tokens": "",
        "cost": "",
        "kb_method": "none",
        "kb_hit": "False",
        "kb_entry_id": "",
        "kb_score": "",
        "fallbacks": "1",
        "retries": "2",
        "retry_wait_ms": "375.0",
        "retry_causes": "server_error connect",
        "skipped_chunks": "0",
        "features": "",
        "request_key": str(kept.key),
        "priority": "",
        "personal_data": "phone",
        "personal_data_action": "sent",
        "injection": "",
        "injection_action": "",
    }
    everything = exported(operator_client.get(EXPORT, {"period": "all"}))
    assert len(everything) == 4


@pytest.mark.django_db
def test_the_export_writes_no_cell_a_spreadsheet_would_run_as_a_formula(operator_client):
    write(record(rule='=HYPERLINK("http://evil.example")', target="@SUM(A1)"))
    [row] = exported(operator_client.get(EXPORT))
    assert row["rule"] == '\'=HYPERLINK("http://evil.example")' and row["target"] == "'@SUM(A1)"


@pytest.mark.django_db
def test_the_log_cannot_be_added_to_changed_or_deleted(admin_client):
    [row] = write(record(rule="kept"))
    pk = RequestLog.objects.get(request_key=row.key).pk
    changelist = admin_client.get(LIST).content.decode()
    assert f"{LIST}add/" not in changelist and 'name="action"' not in changelist
    assert admin_client.get(f"{LIST}add/").status_code == 403
    view = admin_client.get(f"{LIST}{pk}/change/")
    assert (
        view.status_code == 200
        and "kept" in view.content.decode()
        and 'name="_save"' not in view.content.decode()
    )
    assert admin_client.post(f"{LIST}{pk}/change/", {"rule": "changed"}).status_code == 403
    assert admin_client.post(f"{LIST}{pk}/delete/", {"post": "yes"}).status_code == 403
    assert RequestLog.objects.get(pk=pk).rule == "kept"


@pytest.mark.django_db
def test_a_row_whose_user_key_and_entry_are_gone_still_lists_and_exports(
    operator_client, django_user_model
):
    gone = django_user_model.objects.create_user("gone", password="pw-gone-123456")
    key = apikey_create(user=gone, name="old", scopes=["chat"])[0]
    entry = entry_create(question="Old question?", answer="Old answer.", embed="none")
    [row] = write(
        record(
            user_id=gone.pk, api_key_id=key.pk, kb_entry_id=entry.pk, kb_score=0.71, rule="orphan"
        )
    )
    ids = (gone.pk, key.pk, entry.pk)
    entry.delete()
    gone.delete()  # its keys go with it; the log keeps the ids

    response = operator_client.get(LIST)
    assert response.status_code == 200
    [listed] = result_rows(response)
    assert f"#{ids[0]} (deleted)" in listed and f"#{ids[1]} (deleted)" in listed
    assert f"KB#{ids[2]} (deleted)" in listed
    pk = RequestLog.objects.get(request_key=row.key).pk
    detail = operator_client.get(f"{LIST}{pk}/change/")
    assert detail.status_code == 200 and f"#{ids[0]} (deleted)" in detail.content.decode()
    [exported_row] = exported(operator_client.get(EXPORT))
    assert (exported_row["user_id"], exported_row["user"], exported_row["api_key"]) == (
        str(ids[0]),
        "",
        "",
    )


@pytest.mark.django_db
def test_only_staff_with_the_view_permission_read_or_export_the_log(
    operator_client, curator_client, user_client, client
):
    write(record(rule="secret-rule"))
    for url in (LIST, EXPORT):
        for outsider in (client, user_client):
            response = outsider.get(url)
            assert response.status_code == 302 and response["Location"].startswith(
                "/admin/login/?next="
            )
        assert curator_client.get(url).status_code == 403
        assert operator_client.get(url).status_code == 200
    assert "secret-rule" in b"".join(operator_client.get(EXPORT).streaming_content).decode()


@pytest.mark.django_db
def test_a_count_that_would_take_too_long_gives_way_to_the_planners_estimate():
    write(*[record() for _ in range(3)])
    quick = CountOrEstimatePaginator(RequestLog.objects.order_by("-at"), 100)
    assert (quick.count, quick.estimated) == (3, False)

    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()[0]
    slow = CountOrEstimatePaginator(
        RequestLog.objects.extra(where=["(SELECT true FROM pg_sleep(0.2))"]).order_by("-at"), 100
    )
    slow.timeout_ms = 20
    assert isinstance(slow.count, int) and slow.estimated
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == before  # the caller's transaction keeps its own limit
    assert RequestLog.objects.count() == 3  # and is still usable


@pytest.fixture
def written_for_the_server():
    """Rows a server in another process can read: committed, so removed by hand afterwards (the
    test database's flush leaves a table Django does not manage)."""
    keys = []
    yield keys
    RequestLog.objects.filter(request_key__in=keys).delete()


@pytest.mark.django_db(transaction=True)
def test_the_export_streams_from_the_asgi_server(asgi_server, operator, written_for_the_server):
    rows = write(*[record(rule=f"rule-{i}", ago=timedelta(minutes=i)) for i in range(5)])
    written_for_the_server.extend(r.key for r in rows)
    cookie = f"sessionid={client_of(operator).cookies['sessionid'].value}"
    request = urllib.request.Request(f"{asgi_server}{EXPORT}?o=1", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        # Sent as it is read: no length known up front.
        assert (
            response.headers["Transfer-Encoding"] == "chunked"
            and "Content-Length" not in response.headers
        )
        lines = list(csv.DictReader(io.StringIO(response.read().decode())))
    assert [line["rule"] for line in lines] == [
        f"rule-{i}" for i in reversed(range(5))
    ]  # by time, oldest first
    assert {uuid.UUID(line["request_key"]) for line in lines} == {r.key for r in rows}
    assert datetime.fromisoformat(lines[0]["time"]).tzinfo is not None
