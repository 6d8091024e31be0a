"""The operators' dashboard: the figures a period's request log rows imply, engine states, the
most-asked missed questions with their way into the KB; staff with the log's permission only."""

import re
import uuid
import xml.etree.ElementTree as ET
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import charts
from inference_ops.models import EngineEvent, EngineProcess
from knowledge.models import Entry, Feedback, Hit, Miss
from observability.selectors.periods import PERIODS, period_at
from tests.config.test_security_headers import InlineCode
from tests.observability.test_requestlog_admin import record, write
from tests.support.factories import endpoint

# Each test starts from an empty log and writes its rows itself (conftest.rows_by_hand).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rows_by_hand")]

LIST = "/admin/observability/requestlog/"
DASHBOARD = f"{LIST}dashboard/"
SVG = "{http://www.w3.org/2000/svg}"


def the_traffic():
    """Ten requests a minute ago: four KB answers (three exact, one by vector), four local answers,
    and two to a named external model (no KB check): an answer, and a failure after a fallback."""
    rows = [
        record(
            road="kb",
            rule="faq",
            target=f"KB#{i}",
            kb_method="exact" if i < 3 else "vector",
            kb_hit=True,
            kb_entry_id=i,
            kb_score=0.9,
            ttft_ms=4.0,
            latency_ms=5.0,
            overhead_ms=5.0,
            ago=timedelta(minutes=1),
        )
        for i in range(4)
    ]
    rows += [
        record(
            road="local",
            target="local",
            ttft_ms=t,
            latency_ms=t * 10,
            overhead_ms=t / 10,
            ago=timedelta(minutes=1),
        )
        for t in (100.0, 200.0, 300.0, 400.0)
    ]
    rows += [
        record(
            road="external",
            target="external",
            kb_method="",
            ttft_ms=50.0,
            latency_ms=500.0,
            interface="v1",
            wait_ms=40.0,  # waited for room at the endpoint's capacity
            ago=timedelta(minutes=1),
        ),
        record(
            road="external",
            target="external",
            kb_method="",
            status="failed",
            error_code="engine_timeout",
            ttft_ms=None,
            latency_ms=30000.0,
            overhead_ms=None,
            fell_back_from=("local",),
            ago=timedelta(minutes=1),
        ),
    ]
    return write(*rows)


def fragment(html: str, start: str, end: str) -> str:
    begin = html.index(start)
    return html[begin : html.index(end, begin) + len(end)]


def figure(html: str, name: str) -> str:
    return re.search(rf'<dd id="{name}">(.*?)</dd>', html).group(1)


def target_row(html: str, name: str) -> dict[str, str]:
    table = ET.fromstring(fragment(html, '<table id="targets">', "</table>"))
    for row in table.iter("tr"):
        if row.get("data-target") == name:
            return {
                cell.get("class"): "".join(cell.itertext()).strip()
                for cell in row.iter("td")
                if cell.get("class")
            }
    raise AssertionError(f"no row for {name}")


def chart(html: str, css: str) -> ET.Element:
    marked = html.index(f'class="{css}"')
    start = html.rindex("<svg", 0, marked)
    return ET.fromstring(html[start : html.index("</svg>", marked) + len("</svg>")])


def marks(svg: ET.Element) -> list[str]:
    return [title.text for title in svg.iter(f"{SVG}title")][1:]  # the first names the chart


def test_the_dashboard_shows_the_figures_the_rows_imply(operator_client):
    written = the_traffic()
    write(record(road="local", target="local", ago=timedelta(hours=3)))  # outside the last hour
    response = operator_client.get(DASHBOARD, {"period": "hour"})
    assert response.status_code == 200
    html = response.content.decode()

    assert figure(html, "requests") == "10"
    assert [figure(html, f"road-{road}") for road in ("kb", "local", "external", "none")] == [
        "4",
        "4",
        "2",
        "0",
    ]
    assert figure(html, "hit-ratio") == "50%"  # 4 hits of the 8 questions the KB looked at
    assert (figure(html, "hits-exact"), figure(html, "hits-vector")) == ("3", "1")
    assert (figure(html, "failed"), figure(html, "fell-back")) == ("1", "1")

    local = target_row(html, "local")
    assert local == {
        "requests": "4",
        "ttft-p50": "250",
        "ttft-p95": "385",
        "latency-p50": "2500",
        "latency-p95": "3850",
        "overhead-p50": "25",
        "overhead-p95": "38.5",
        "waited": "0",
        "wait-p95": "—",
        "failed": "0",
        "fallbacks": "0",
    }
    external = target_row(html, "external")
    assert (external["requests"], external["ttft-p50"], external["latency-p50"]) == (
        "2",
        "50",
        "500",
    )
    assert (external["waited"], external["wait-p95"]) == ("1", "40")
    assert (external["failed"], external["fallbacks"]) == (
        "1",
        "1",
    )  # the failure's 30 s is not a latency
    kb = target_row(html, "knowledge base")  # one row for every entry that answered
    assert (kb["requests"], kb["ttft-p50"]) == ("4", "4")

    errors = fragment(html, '<table id="errors">', "</table>")
    assert ">engine_timeout</a>" in errors and '<td class="requests">1</td>' in errors
    assert "period=hour&amp;error_code=engine_timeout" in errors

    slot = timezone.localtime(written[0].at)
    slot_label = slot.replace(minute=slot.minute - slot.minute % 5).strftime("%H:%M")
    roads = marks(chart(html, "chart-roads"))
    assert (
        f"{slot_label} · knowledge base: 4 requests" in roads
        and f"{slot_label} · local model: 4 requests" in roads
    )
    assert f"{slot_label} · external model: 2 requests" in roads and len(roads) == 3
    assert marks(chart(html, "chart-hits")) == [f"{slot_label} · KB hit ratio: 50.0%"]
    assert f"{slot_label} · failed: 1 requests" in marks(chart(html, "chart-errors"))
    latency = marks(chart(html, "chart-latency"))
    assert "local · TTFT p50: 250 ms" in latency and "local · latency p95: 3850 ms" in latency


def screening_table(html: str, table: str, key: str) -> dict[str, dict[str, str]]:
    """A screening table's rows by type or kind ("" for the any-type row): its cells by class."""
    parsed = ET.fromstring(fragment(html, f'<table id="{table}">', "</table>"))
    return {
        row.get(key): {cell.get("class"): cell.text for cell in row.iter("td") if cell.get("class")}
        for row in parsed.iter("tr")
        if row.get(key) is not None
    }


def test_the_dashboard_counts_personal_data_by_type_and_injections_by_kind_and_action(
    operator_client,
):
    a_minute = timedelta(minutes=1)
    write(
        record(ago=a_minute),  # nothing found
        record(personal_data="email phone", personal_data_action="local", ago=a_minute),
        record(personal_data="phone", personal_data_action="redacted", ago=a_minute),
        record(personal_data="phone", personal_data_action="redacted", ago=a_minute),
        record(
            personal_data="cn_id",
            personal_data_action="refused",
            status="failed",
            error_code="personal_data",
            ago=a_minute,
        ),
        record(injection="role_override", injection_action="logged", ago=a_minute),
        record(
            injection="role_override",
            injection_action="refused",
            personal_data="email",
            personal_data_action="",  # refused before a road was chosen: none noted
            ago=a_minute,
        ),
        record(personal_data="email", personal_data_action="sent", ago=timedelta(hours=3)),
    )
    html = operator_client.get(DASHBOARD, {"period": "hour"}).content.decode()

    found = screening_table(html, "personal-data", "data-type")
    assert found["phone"] == {
        "action-local": "1",
        "action-redacted": "2",
        "action-sent": "0",
        "action-refused": "0",
        "action-none": "0",
        "requests": "3",
    }
    assert (found["email"]["action-local"], found["email"]["action-none"]) == ("1", "1")
    assert (found["cn_id"]["action-refused"], found["cn_id"]["requests"]) == ("1", "1")
    assert list(found) == ["phone", "email", "cn_id", ""]  # busiest first, then every request
    assert found[""] == {
        "action-local": "1",
        "action-redacted": "2",
        "action-sent": "0",  # three hours ago: another period's
        "action-refused": "1",
        "action-none": "1",
        "requests": "5",
    }
    assert "period=hour&amp;personal_data=phone" in html

    injections = screening_table(html, "injections", "data-injection")
    assert injections == {
        "role_override": {
            "action-logged": "1",
            "action-routed": "0",
            "action-refused": "1",
            "requests": "2",
        }
    }
    assert "period=hour&amp;injection=role_override" in html


def test_a_period_without_findings_says_so(operator_client):
    write(record(ago=timedelta(minutes=1)))
    html = operator_client.get(DASHBOARD, {"period": "hour"}).content.decode()
    assert "No personal data found in this period." in html
    assert "No suspected prompt injections in this period." in html
    assert 'data-type="' not in html and 'data-injection="' not in html


def test_each_period_counts_its_own_rows(operator_client):
    write(
        record(ago=timedelta(minutes=10)),
        record(ago=timedelta(hours=5)),
        record(ago=timedelta(days=3)),
        record(ago=timedelta(days=9)),
    )
    counts = {
        name: figure(operator_client.get(DASHBOARD, {"period": name}).content.decode(), "requests")
        for name in PERIODS
    }
    assert counts == {"hour": "1", "day": "2", "week": "3"}
    assert (
        figure(operator_client.get(DASHBOARD).content.decode(), "requests") == "2"
    )  # the last day unless asked


def test_each_period_is_cut_into_its_slots():
    now = timezone.now()
    for name, (span, slot) in PERIODS.items():
        period = period_at(name, now=now)
        assert (
            period.end - period.start == span
            and period.start <= now - span + slot
            and now < period.end
        )
        assert len(period.slots) == span / slot and all(
            (s - period.start) % slot == timedelta(0) for s in period.slots
        )


def test_the_period_selector_links_each_period_and_the_matching_log(operator_client):
    html = operator_client.get(DASHBOARD, {"period": "week"}).content.decode()
    assert (
        '<a href="?period=hour">last hour</a>' in html
        and '<a href="?period=day">last day</a>' in html
    )
    assert '<strong aria-current="page">last week</strong>' in html
    assert f'href="{LIST}?period=week"' in html


def test_an_unknown_period_is_refused_with_a_message(operator_client):
    response = operator_client.get(DASHBOARD, {"period": "year"})
    assert response.status_code == 400
    assert response.content.decode() == "period must be one of: hour, day, week."


def test_the_engines_states_through_the_period_are_drawn(operator_client):
    gpu = EngineProcess.objects.create(
        name="gpu-1",
        endpoint=endpoint("local", url="http://127.0.0.1:9/v1"),
        model="acme/local",
        port=8101,
        status=EngineProcess.Status.READY,
        # As the engine's last health check read its counters: 8,000 of 10,000 prompt tokens
        # found in the prefix cache.
        metrics={"running": 2, "prefix_cache_queries": 10_000, "prefix_cache_hits": 8_000},
    )
    EngineProcess.objects.create(
        name="cold",
        endpoint=endpoint("other", url="http://127.0.0.1:9/v1"),
        model="acme/local",
        port=8102,
    )
    now = timezone.now()
    for status, ago in (
        ("ready", timedelta(hours=3)),
        ("crashed", timedelta(minutes=30)),
        ("restarting", timedelta(minutes=29)),
        ("ready", timedelta(minutes=20)),
    ):
        event = EngineEvent.objects.create(engine=gpu, status=status, reason=f"went {status}")
        EngineEvent.objects.filter(pk=event.pk).update(at=now - ago)
    html = operator_client.get(DASHBOARD, {"period": "hour"}).content.decode()

    bands = [band for band in marks(chart(html, "chart-engines")) if band.startswith("gpu-1")]
    assert [band.split(" from ")[0] for band in bands] == [
        "gpu-1: ready",
        "gpu-1: crashed",
        "gpu-1: restarting",
        "gpu-1: ready",
    ]
    crashed_at = timezone.localtime(now - timedelta(minutes=30)).strftime("%H:%M")
    assert bands[1] == f"gpu-1: crashed from {crashed_at} to " + timezone.localtime(
        now - timedelta(minutes=29)
    ).strftime("%H:%M")
    engines = fragment(html, '<table id="engines">', "</table>")
    cells = re.findall(r'<td class="prefix-cache">(.*?)</td>', engines, re.S)
    assert [" ".join(re.sub("<[^>]+>", "", c).split()) for c in cells] == [
        "—",  # no counters read yet
        "0.80 (8000 of 10000 tokens)",
    ]
    recent = fragment(html, '<table id="engine-events">', "</table>")
    assert (
        recent.count("<tr>") == 4 and "went crashed" in recent
    )  # the three of the hour, and the header
    assert (
        "went ready" in recent
        and f'href="/admin/inference_ops/engineprocess/{gpu.pk}/change/"' in html
    )


def _misses(
    question: str, *, answer: str = "A generated answer.", recent: int, older: int = 0, **fields
):
    """A group of misses as the grouping leaves it: its head and members, `recent` of them in the
    last hour and `older` before the week."""
    now = timezone.now()
    head = Miss.objects.create(
        question=question,
        normalized=question.lower(),
        answer=answer,
        count=recent + older,
        grouped_at=now,
        **fields,
    )
    members = [
        Miss.objects.create(
            question=question,
            normalized=question.lower(),
            answer=answer,
            group=head,
            grouped_at=now,
        )
        for _ in range(recent + older - 1)
    ]
    for miss in ([head, *members])[recent:]:
        Miss.objects.filter(pk=miss.pk).update(created_at=now - timedelta(days=10))
    return head


def test_the_most_asked_missed_questions_lead_to_turning_one_into_an_entry(admin_client):
    often = _misses("Can I pay by invoice?", recent=2, older=5)
    _misses("Do you ship to Mars?", recent=3)
    _misses("How do I export my data?", answer="", recent=1)
    done = _misses(
        "Where is my order?",
        recent=9,
        resolved_by=Entry.objects.create(question="Where?", answer="Here."),
    )
    Miss.objects.create(question="Still waiting", normalized="still waiting")  # not grouped yet

    html = admin_client.get(DASHBOARD, {"period": "hour"}).content.decode()
    table = fragment(html, '<table id="misses">', "</table>")
    assert re.findall(r'data-miss="(\d+)"', table)[0] == str(
        often.pk
    )  # the most asked of all first
    assert (
        table.index("Can I pay by invoice?")
        < table.index("Do you ship to Mars?")
        < table.index("export my data")
    )
    assert f'data-miss="{done.pk}"' not in table  # has its entry already
    row = fragment(table, f'data-miss="{often.pk}"', "</tr>")
    assert '<td class="asked">7</td>' in row and '<td class="asked-in-period">2</td>' in row
    assert "no generated answer" in fragment(table, "export my data", "</tr>")
    assert "1 more misses wait to be grouped" in html

    response = admin_client.post(
        "/admin/knowledge/miss/",
        {"action": "make_entry", "_selected_action": often.pk, "index": 0},
        follow=True,
    )
    entry = Entry.objects.get(question="Can I pay by invoice?")
    assert response.redirect_chain[-1][0] == f"/admin/knowledge/entry/{entry.pk}/change/"
    assert entry.answer == "A generated answer."
    assert "Can I pay by invoice?" not in fragment(
        admin_client.get(DASHBOARD).content.decode(), '<table id="misses">', "</table>"
    )


def test_the_turn_into_entry_button_posts_the_miss_to_the_misses_admin(admin_client):
    head = _misses("Can I pay by invoice?", recent=1)
    html = admin_client.get(DASHBOARD).content.decode()
    form = fragment(fragment(html, f'data-miss="{head.pk}"', "</tr>"), "<form", "</form>")
    assert (
        'method="post" action="/admin/knowledge/miss/"' in form
        and 'name="csrfmiddlewaretoken"' in form
    )
    assert (
        'name="action" value="make_entry"' in form
        and f'name="_selected_action" value="{head.pk}"' in form
    )


def test_staff_who_cannot_see_misses_get_the_dashboard_without_them(operator_client):
    _misses("Can I pay by invoice?", recent=1)
    html = operator_client.get(DASHBOARD).content.decode()
    assert (
        'id="targets"' in html and 'id="misses"' not in html and "Can I pay by invoice?" not in html
    )


def test_the_dashboard_refuses_anonymous_users_users_who_are_not_staff_and_staff_without_the_log(
    client, user_client, curator_client
):
    for outsider in (client, user_client):
        response = outsider.get(DASHBOARD)
        assert response.status_code == 302
        assert response["Location"] == f"/admin/login/?next={DASHBOARD}"
    assert curator_client.get(DASHBOARD).status_code == 403


def test_the_admin_index_links_the_dashboard_for_those_who_may_read_it(
    operator_client, curator_client
):
    assert f'<a href="{DASHBOARD}">Dashboard</a>' in operator_client.get("/admin/").content.decode()
    assert DASHBOARD not in curator_client.get("/admin/").content.decode()
    assert f'<a href="{DASHBOARD}">Dashboard</a>' in operator_client.get(LIST).content.decode()


def test_the_dashboard_reads_in_the_same_few_queries_whatever_the_rows(admin_client):
    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(DASHBOARD, {"period": "week"}).status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    empty = queries()
    the_traffic()
    write(*[record(target=f"endpoint-{i}", ago=timedelta(days=i), cost=0.01) for i in range(6)])
    for i in range(3):
        engine = EngineProcess.objects.create(
            name=f"gpu-{i}",
            endpoint=endpoint(f"e{i}", url="http://127.0.0.1:9/v1"),
            model="acme/local",
            port=8200 + i,
        )
        EngineEvent.objects.create(engine=engine, status="ready")
    for i in range(4):
        _misses(f"Question {i}?", recent=2)
    busy = queries()
    assert len(busy) == len(empty)
    reads = [
        sql
        for sql in busy
        if "chat_requestlog" in sql or "engine" in sql or "knowledge_miss" in sql
    ]
    # traffic, targets, errors, what requests asked for beyond text, engines, their events,
    # misses, the KB loop's days and what waits, spend over time and its top spenders, what the
    # screening found
    assert len(reads) == 12
    assert all(
        "at >= " in sql for sql in busy if "chat_requestlog" in sql
    )  # each bounded by the period


def test_the_dashboard_holds_nothing_the_content_security_policy_refuses(admin_client):
    the_traffic()
    response = admin_client.get(DASHBOARD)
    parser = InlineCode()
    parser.feed(response.content.decode())
    assert parser.found == []
    assert "/static/observability/dashboard.css" in response.content.decode()


def test_every_chart_scales_to_the_width_of_a_phone(admin_client):
    the_traffic()
    html = admin_client.get(DASHBOARD).content.decode()
    for css in ("chart-roads", "chart-hits", "chart-errors", "chart-latency", "chart-engines"):
        svg = chart(html, css)
        assert (
            svg.get("viewBox").startswith("0 0 480 ")
            and svg.get("width") is None
            and svg.get("height") is None
        )


def test_the_charts_escape_their_text_and_stay_well_formed():
    hostile = '<script>alert("x")</script> & co'
    for svg in (
        charts.bars_over_time(
            ["10:00", "<b>"], [charts.Series(hostile, "#000", [1, 2])], label=hostile
        ),
        charts.lines_over_time(
            ["10:00", "11:00"],
            [charts.Series(hostile, "#000", [0.5, None])],
            label=hostile,
            percent=True,
        ),
        charts.percentile_bars(
            [(hostile, [("TTFT", 1.0, 2.0)])], measures=[("TTFT", "#000")], label=hostile
        ),
        charts.timeline(
            [(hostile, [(0.0, 1.0, "#000", hostile)])],
            ticks=[(0.5, hostile)],
            keys=[(hostile, "#000")],
            label=hostile,
        ),
    ):
        assert (
            "<script>" not in svg
            and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in svg
        )
        ET.fromstring(svg)


def test_an_empty_period_says_so_in_every_chart(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    for css in (
        "chart-roads",
        "chart-hits",
        "chart-latency",
    ):  # no error is a figure: 0 in each slot
        texts = [t.text for t in chart(html, css).iter(f"{SVG}text")]
        assert "Nothing in this period" in texts, css
    assert "No requests in this period." in html and "No errors in this period." in html


def _hit(question, entry, *, ago=timedelta(0), key=None, review=""):
    return Hit.objects.create(
        question=question,
        normalized=question.lower(),
        entry=entry,
        method="vector",
        score=0.95,
        created_at=timezone.now() - ago,
        key=key or uuid.uuid4(),
        review=review,
    )


def test_the_kb_loop_shows_the_hit_rate_of_answerable_traffic_per_day_verdicts_and_the_queue(
    admin_client,
):
    entry = Entry.objects.create(question="How do I cancel my order?", answer="Open Orders.")
    # Yesterday: 1 direct answer, 3 misses of which a curator has since attached 1 to an entry.
    _hit("cancel my order", entry, ago=timedelta(days=1))
    for i in range(3):
        miss = Miss.objects.create(
            question=f"cancel order {i}", normalized=f"cancel order {i}", best_entry=entry
        )
        Miss.objects.filter(pk=miss.pk).update(created_at=timezone.now() - timedelta(days=1))
    Miss.objects.filter(question="cancel order 0").update(resolved_by=entry)
    # Today: 4 direct answers: one question marked wrong twice (one row in the queue), one wrong
    # and reviewed, one right; and a thumbs up on a generated answer (no Hit).
    queued = _hit("cancel my ordr", entry)
    again = _hit("cancel my ordr", entry)
    reviewed = _hit("cancel the order", entry, review="wrong")
    liked = _hit("how to cancel my order", entry)
    for hit, verdict in ((queued, "down"), (again, "down"), (reviewed, "down"), (liked, "up")):
        Feedback.objects.create(
            request_key=hit.key, verdict=verdict, interface="web", queued=verdict == "down"
        )
    Feedback.objects.create(request_key=uuid.uuid4(), verdict="up", interface="v1")
    # An open group with a closest entry: one phrasing away.
    head = Miss.objects.create(
        question="kill my order", normalized="kill my order", best_entry=entry, count=4
    )
    Miss.objects.filter(pk=head.pk).update(grouped_at=timezone.now())

    html = admin_client.get(DASHBOARD).content.decode()
    panel = html[html.index('id="kb-loop"') :]
    assert re.search(r'id="review-open"[^>]*><strong>1</strong> question marked wrong', panel)
    assert re.search(
        r'id="one-phrasing"[^>]*><strong>4</strong> missed questions in 1 group', panel
    )
    rows = re.findall(r"<tr><td>[^<]+</td>((?:<td>[^<]*</td>\s*)+)</tr>", panel)
    cells = [re.findall(r"<td>([^<]*)</td>", row) for row in rows[:2]]
    # Today, then yesterday: direct, missed, since attached, hit rate, of answerable, up, down,
    # down on direct.
    assert cells[0] == ["4", "1", "0", "80 %", "100 %", "2", "3", "3"]  # the group's head: a miss
    assert cells[1] == ["1", "3", "1", "25 %", "50 %", "0", "0", "0"]
    assert len(rows) == 14
    assert "chart-loop" in panel


def test_staff_who_cannot_see_the_kb_get_no_loop(operator_client):
    assert 'id="kb-loop"' not in operator_client.get(DASHBOARD).content.decode()


def test_the_spend_panel_shows_the_top_spenders_and_the_budgets_that_need_a_look(
    admin_client, alice, bob
):
    from asgiref.sync import async_to_sync
    from django.contrib.auth.models import Group

    from chat.apikeys import apikey_create
    from spend import ledger
    from spend.models import Limit
    from spend.policy import spec_of

    support = Group.objects.create(name="support")
    support.user_set.add(alice)
    key = apikey_create(user=alice, name="ci", scopes=["chat"])[0]
    write(
        record(target="external", cost=0.30, user_id=alice.pk, api_key_id=key.pk),
        record(target="external", cost=0.20, user_id=alice.pk),
        record(target="local", cost=0.05, user_id=bob.pk),
        record(road="kb", target="KB#1", cost=0.0, user_id=bob.pk),
    )
    warned = Limit.objects.create(user=alice, budget=1, warn_at=0.5)
    spent = Limit.objects.create(group=support, budget=0.4, over_budget="reroute")
    Limit.objects.create(user=bob, budget=10)
    for limit, cost in ((warned, 0.6), (spent, 0.5)):
        booked = async_to_sync(ledger.areserve)((spec_of(limit),), tokens=0, cost=cost)
        assert isinstance(booked, ledger.Reservation)

    page = admin_client.get(DASHBOARD, {"period": "day"}).content.decode()
    panel = page.split('id="spend"')[1].split("</section>")[0]
    assert '<strong id="spend-total">0.5500</strong> USD' in panel
    spenders = re.findall(
        r'<tr data-kind="([^"]+)"><td>[^<]*</td><td>([^<]+)</td><td class="cost">([^<]+)</td>',
        panel,
    )
    assert spenders == [
        ("API key", "ci (alice)", "0.3000"),
        ("user", "alice", "0.5000"),
        ("user", "bob", "0.0500"),
        ("group", "support", "0.5000"),
        ("target", "external", "0.5000"),
        ("target", "local", "0.0500"),
    ]
    budgets = re.findall(r'<tr class="budget-(\w+)"><td><a [^>]+>([^<]+)</a>', panel)
    assert budgets == [("spent", "group support"), ("warn", "user alice"), ("ok", "user bob")]
    assert "chart-spend" in panel


def test_budgets_are_for_those_who_may_see_the_limits(client):
    from tests.support.personas import staff_user

    viewer = staff_user("logreader", perms=("observability.view_requestlog",))
    client.force_login(viewer)
    page = client.get(DASHBOARD).content.decode()
    assert 'id="spend"' in page and 'id="budgets"' not in page
