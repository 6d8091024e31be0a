"""Every page carries the Content-Security-Policy (config.csp) and the other security headers,
and no page holds what that policy refuses: inline scripts, inline handlers, inline styles."""

import subprocess
import sys
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from config.settings import BASE_DIR
from knowledge.services.entries import entry_create

pytestmark = pytest.mark.django_db

EXPECTED = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
    "style-src": ["'self'"],
}


def directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        name, *sources = part.split()
        assert name not in parsed, f"{name} twice"
        parsed[name] = sources
    return parsed


class InlineCode(HTMLParser):
    """Collects what a script-src 'self' / style-src 'self' policy would block in a page."""

    def __init__(self):
        super().__init__()
        self.found = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name, _ in attrs:
            if name.startswith("on") or name == "style":
                self.found.append(f"<{tag} {name}=…>")
        if any(
            (value or "").lower().lstrip().startswith("javascript:")
            for value in attributes.values()
        ):
            self.found.append(f"<{tag}> with a javascript: URL")
        if tag == "style":
            self.found.append("<style> block")
        self._in_script = (
            tag == "script"
            and "src" not in attributes
            and attributes.get("type") != "application/json"
        )

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.found.append(f"inline <script>: {data.strip()[:60]!r}")


@pytest.fixture
def admin_client(db):
    admin = get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client = Client()
    client.force_login(admin)
    return client


def page_urls():
    entry = entry_create(
        question="How do I reset my password?", answer="Use **Forgot password**.", embed="none"
    )
    return [
        "/",
        "/keys/",
        "/admin/",
        "/admin/knowledge/entry/",
        "/admin/knowledge/entry/add/",
        f"/admin/knowledge/entry/{entry.pk}/change/",
        "/admin/knowledge/entry/try/?q=reset",
        "/admin/routing/routingrule/",
        "/admin/routing/routingrule/add/",
        "/admin/auth/user/",
        "/admin/inference_ops/modelendpoint/add/",
        "/admin/password_change/",
        "/api/docs/",
    ]


def assert_protected(response, url):
    assert "Content-Security-Policy" in response, url
    policy = directives(response["Content-Security-Policy"])
    for name, sources in EXPECTED.items():
        assert policy.get(name) == sources, (url, name, policy.get(name))
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert "'unsafe-eval'" not in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


def test_every_page_of_a_signed_in_admin_sends_the_policy_and_holds_no_inline_code(admin_client):
    for url in page_urls():
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert_protected(response, url)
        if response["Content-Type"].startswith("text/html"):
            parser = InlineCode()
            parser.feed(response.content.decode())
            assert parser.found == [], (url, parser.found)


def test_the_login_pages_redirects_and_error_pages_send_the_policy(client):
    for url, status in [
        ("/accounts/login/", 200),
        ("/admin/login/", 200),
        ("/", 302),
        ("/no-such-page/", 404),
        ("/api/docs/?script=", 200),
    ]:
        response = client.get(url)
        assert response.status_code == status, url
        assert_protected(response, url)
        if response["Content-Type"].startswith("text/html"):
            parser = InlineCode()
            parser.feed(response.content.decode())
            assert parser.found == [], (url, parser.found)


def test_a_server_error_page_sends_the_policy(client, settings):
    settings.ROOT_URLCONF = "tests.support.failing_urls"
    client.raise_request_exception = False
    response = client.get("/boom/")
    assert response.status_code == 500
    assert_protected(response, "/boom/")


def test_the_policy_lets_the_page_open_its_own_websocket(admin_client):
    policy = directives(admin_client.get("/")["Content-Security-Policy"])
    assert policy["connect-src"] == ["'self'", "ws://testserver", "wss://testserver"]


def test_with_debug_on_only_djangos_technical_error_pages_go_without_the_policy(settings):
    settings.DEBUG = True
    client = Client()  # its handler, and so the middleware, is built with DEBUG on
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404 and b"Page not found" in missing.content
    assert "Content-Security-Policy" not in missing
    assert "Content-Security-Policy" in client.get("/accounts/login/")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://reports.example.com/csp", "report-uri https://reports.example.com/csp"),
        (
            "javascript:alert(1)",
            "Environment variable CSP_REPORT_URI must be a URL with scheme http or https",
        ),
    ],
)
@pytest.mark.processes
def test_csp_report_uri_from_the_environment_adds_a_report_uri(child_env, value, expected):
    code = (
        "from config.csp import policy_header; from django.conf import settings; "
        "print(policy_header(settings.SECURE_CSP))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**child_env, "CSP_REPORT_URI": value},
    )
    assert expected in done.stdout + done.stderr
