"""The dashboard's admission panel: each endpoint with a capacity, its slots held and the requests
waiting now by class (every process's, from Redis), and the period's waits by class from the
request log; refreshed in place by the page's script from ?panel=admission."""

import re
from datetime import timedelta

import pytest
from django.conf import settings

from tests.observability.test_requestlog_admin import record, write
from tests.support.admission import Standing, endpoint_name, forget
from tests.support.factories import endpoint
from tests.support.polling import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rows_by_hand")]

DASHBOARD = "/admin/observability/requestlog/dashboard/"


@pytest.fixture
def engine():
    name, url = endpoint_name("dash-admission"), settings.REDIS_URL
    row = endpoint(name, url="http://127.0.0.1:9/v1", capacity=1)
    yield row
    forget(name, url)


@pytest.fixture
def standing():
    requests = Standing()
    yield requests
    requests.close()


def live(html: str, name: str, cell: str) -> str | None:
    found = re.search(rf'data-live="{re.escape(name)}\|{cell}">([^<]*)<', html)
    return found.group(1) if found else None


def waiting_shown(client, name: str, priority: str, count: str):
    def shown():
        html = client.get(DASHBOARD).content.decode()
        return html if live(html, name, f"waiting\\|{priority}") == count else None

    return wait_until(shown, timeout=15, step=0.2)


def test_a_request_held_waiting_shows_as_waiting_with_its_class(
    operator_client, engine, standing, settings
):
    settings.ADMISSION_DEADLINE_INTERACTIVE = 120.0
    settings.ADMISSION_RESERVE = 0
    name = engine.name
    running = standing.enter(name, 1, tenant="integration", priority="api").result(10)
    waiter = standing.enter(name, 1, tenant="person", priority="interactive")

    html = waiting_shown(operator_client, name, "interactive", "1")
    assert html is not None, "the waiting request never showed on the dashboard"
    row = re.search(rf'<tr data-endpoint="{re.escape(name)}">.*?</tr>', html, re.S).group(0)
    assert '<td class="capacity">1</td>' in row
    assert live(row, name, "held") == "1"
    assert live(row, name, "waiting\\|api") == "0"
    assert live(row, name, "waiting\\|batch") == "0"
    assert not waiter.done()

    standing.leave(running)  # its slot given back: the waiting request runs
    waiter.result(10)
    assert waiting_shown(operator_client, name, "interactive", "0") is not None


def test_the_panel_alone_carries_what_is_live_for_the_pages_script(
    operator_client, engine, standing, settings
):
    settings.ADMISSION_DEADLINE_BATCH = 120.0
    settings.ADMISSION_RESERVE = 0
    name = engine.name
    standing.enter(name, 1, tenant="a", priority="api").result(10)
    standing.enter(name, 1, tenant="b", priority="batch")
    standing.enter(name, 1, tenant="c", priority="batch")

    def panel():
        response = operator_client.get(DASHBOARD, {"panel": "admission"})
        assert response.status_code == 200
        html = response.content.decode()
        return html if live(html, name, "waiting\\|batch") == "2" else None

    html = wait_until(panel, timeout=15, step=0.2)
    assert html is not None
    assert "<html" not in html  # the panel, not the page
    assert live(html, name, "held") == "1"
    page = operator_client.get(DASHBOARD).content.decode()
    assert 'src="/static/observability/dashboard.js"' in page


def test_the_periods_waits_are_shown_per_class(operator_client, engine):
    name = engine.name
    write(
        *(
            record(target=name, wait_ms=ms, priority="interactive", ago=timedelta(minutes=1))
            for ms in (10.0, 20.0, 30.0, 40.0)
        ),
        record(target=name, wait_ms=500.0, priority="batch", ago=timedelta(minutes=1)),
        record(target=name, priority="batch", ago=timedelta(minutes=1)),  # did not wait
    )
    html = operator_client.get(DASHBOARD).content.decode()
    row = re.search(rf'<tr data-endpoint="{re.escape(name)}">.*?</tr>', html, re.S).group(0)
    assert re.search(r'class="wait-p95-interactive">38\.5 <span class="help">\(4\)', row)
    assert re.search(r'class="wait-p95-batch">500 <span class="help">\(1\)', row)
    assert re.search(r'class="wait-p95-api">—</td>', row)


def test_an_endpoint_without_a_capacity_is_not_listed(operator_client, engine):
    other = endpoint(endpoint_name("no-capacity"), url="http://127.0.0.1:9/v1")
    html = operator_client.get(DASHBOARD).content.decode()
    assert f'data-endpoint="{engine.name}"' in html
    assert f'data-endpoint="{other.name}"' not in html


def test_with_redis_unreachable_the_panel_says_so_and_the_page_still_shows(
    operator_client, engine, settings
):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = operator_client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert live(html, engine.name, "held") == "—"
    assert "Redis is unavailable: the slots held" in html


def test_someone_without_the_logs_permission_gets_no_panel(engine):
    from tests.support.personas import client_of, staff_user

    curator = staff_user("curator", verbs=("view",))
    response = client_of(curator).get(DASHBOARD, {"panel": "admission"})
    assert response.status_code == 403
