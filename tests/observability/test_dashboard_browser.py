"""The dashboard's admission panel in a real browser against the real ASGI server: a request that
starts waiting after the page opened shows up in the panel without a reload (the page's own
script refreshes the live cells), under the page's Content-Security-Policy."""

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from tests.chat.test_browser import browser, log_in, open_page, server, user  # noqa: F401
from tests.support.admission import Standing, endpoint_name, forget
from tests.support.factories import endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DASHBOARD = "/admin/observability/requestlog/dashboard/"


def test_a_request_that_starts_waiting_shows_on_the_open_dashboard(open_page, settings):  # noqa: F811
    settings.ADMISSION_DEADLINE_INTERACTIVE = 120.0
    settings.ADMISSION_RESERVE = 0
    operator = user("watcher")
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="observability", codename="view_requestlog")
    )
    name, url = endpoint_name("watched"), settings.REDIS_URL
    endpoint(name, url="http://127.0.0.1:9/v1", capacity=1)
    standing = Standing()
    try:
        page = open_page().page
        log_in(page, "watcher")
        page.goto(DASHBOARD)
        page.evaluate("window.__opened = true")  # gone if the page were loaded again
        row = page.locator(f'tr[data-endpoint="{name}"]')
        expect(row.locator("td.capacity")).to_have_text("1")
        expect(row.locator("td.held")).to_have_text("0")
        expect(row.locator("td.waiting-interactive")).to_have_text("0")

        standing.enter(name, 1, tenant="integration", priority="api").result(10)
        standing.enter(name, 1, tenant="person", priority="interactive")
        expect(row.locator("td.waiting-interactive")).to_have_text("1", timeout=20_000)
        expect(row.locator("td.held")).to_have_text("1")
        assert page.evaluate("window.__opened === true")  # the same page, not reloaded
    finally:
        standing.close()
        forget(name, url)
