"""The browser chat in a real browser: Debian's Chromium driven by Playwright against
daphne serving the real ASGI application (HTTP and WebSocket) on the test database.

The server is a separate process, so every test writes its rows with
django_db(transaction=True): committed rows are what daphne sees.
"""

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from playwright.sync_api import expect, sync_playwright

from chat.models import ApiKey, ChatSession, Message
from knowledge.models import Feedback
from knowledge.services.entries import entry_create
from tests.chat.hostile_markdown import ALLOWED, EXPLOIT, HOSTILE, random_sources
from tests.inference_ops.simulator_process import start_simulator
from tests.support.factories import endpoint, rule
from tests.support.processes import BASE_DIR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "pw-browser-123456"
KB_QUESTION = "How do I reset my password?"
XSS_QUESTION = "What does the markup canary say?"
XSS_ANSWER = (
    'Careful: <script>alert(1)</script> and <img src=x onerror="alert(2)"> '
    "and [a link](javascript:alert(3)) stay text; **this is bold**."
)
# A first answer may wait for daphne to load the embedding model.
ANSWER_TIMEOUT = 60_000

expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def server(asgi_server):
    return asgi_server


@pytest.fixture(scope="module")
def slow_sim():
    """A simulated local engine writing random words at 50 ms a token: slow enough to watch and
    to stop."""
    sim = start_simulator(
        "serve",
        "acme/local",
        "--max-num-seqs",
        "8",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "50",
        "--mode",
        "random",
        "--seed",
        "7",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API keeps its event loop registered as this thread's running loop,
    # so Django would take every ORM call in these tests for one made from async code.
    # Lifted for this module only; the browser itself runs in its own process.
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install -y chromium)")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


# Runs before any script of the page (Playwright's init scripts are not subject to the page's CSP).
RECORD_VIOLATIONS = """
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (event) => window.__violations.push(
        event.effectiveDirective + " " + (event.blockedURI || "inline") + " "
        + (event.sourceFile || "")));
"""


class Watched:
    """A page with every dialog (an alert() from injected markup would be one), script error and
    Content-Security-Policy violation recorded."""

    def __init__(self, page):
        self.page = page
        self.dialogs = []
        self.errors = []
        self.console_violations = []
        page.add_init_script(RECORD_VIOLATIONS)
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)

    def _console(self, message):
        if "Content Security Policy" in message.text:
            self.console_violations.append(message.text)

    def violations(self):
        """The policy's refusals on the page now open, plus every one the console reported."""
        try:
            seen = self.page.evaluate("window.__violations || []")
        except Exception:  # the page is closed or navigating: the console still has them  # noqa: BLE001
            seen = []
        return seen + self.console_violations

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture
def open_page(browser, server):
    contexts = []
    watched = []

    def open_page(**options):
        context = browser.new_context(base_url=server, **options)
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = Watched(context.new_page())
        watched.append(page)
        return page

    yield open_page
    for context in contexts:
        context.close()
    for page in watched:
        assert page.errors == [], "the page threw"
        assert page.console_violations == [], "the page broke its Content-Security-Policy"


def user(name):
    # The test settings hash with MD5, which the server's settings do not accept: store a
    # PBKDF2 hash (few iterations, for speed; the server re-hashes it at the first login).
    password = PBKDF2PasswordHasher().encode(
        PASSWORD, PBKDF2PasswordHasher().salt(), iterations=1000
    )
    return get_user_model().objects.create(username=name, password=password)


def log_in(page, username):
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "open")


def ask(page, text):
    """Type a question and press Enter; returns the locator of its answer."""
    answers = page.locator(".message.assistant")
    before = answers.count()
    page.locator("#composer").fill(text)
    page.locator("#composer").press("Enter")
    answer = answers.nth(before)
    expect(answer).to_be_attached()
    return answer


def finished(answer, timeout=ANSWER_TIMEOUT):
    expect(answer).not_to_have_attribute("data-status", "streaming", timeout=timeout)
    return answer


def watch_text_grow(page, answer):
    """Lengths of the answer's text, sampled in the page every 30 ms until it stops streaming."""
    return answer.evaluate("""async (el) => {
        const seen = [];
        const until = Date.now() + 60000;
        while (el.dataset.status === "streaming" && Date.now() < until) {
            seen.push(el.querySelector(".bubble").textContent.length);
            await new Promise((resolve) => setTimeout(resolve, 30));
        }
        return seen;
    }""")


def requests_running(sim) -> float:
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


@pytest.fixture
def kb_and_slow_engine(slow_sim):
    """Two KB entries, the slow local engine, a default rule with short answers and an
    `essay` rule with long ones."""
    entry = entry_create(
        question=KB_QUESTION, answer="Use **Forgot password** on the login page.", embed="sync"
    )
    canary = entry_create(question=XSS_QUESTION, answer=XSS_ANSWER, embed="sync")
    local = endpoint("local", slow_sim)
    rule("default", local, is_default=True, use_kb_context=False, max_tokens=40)
    rule(
        "long answers",
        local,
        keywords=["essay"],
        priority=10,
        use_kb_context=False,
        max_tokens=2000,
    )
    return {"entry": entry, "canary": canary}


def test_a_user_asks_watches_tokens_stream_stops_and_finds_the_history_after_reload(
    open_page, kb_and_slow_engine, slow_sim
):
    user("alice")
    watched = open_page()
    page = watched.page
    log_in(page, "alice")

    # The KB answers at once, rendered as Markdown, with its road, target, timings and source.
    kb = finished(ask(page, KB_QUESTION))
    assert kb.get_attribute("data-status") == "complete"
    expect(kb.locator(".badge")).to_have_attribute("data-road", "kb")
    expect(kb.locator(".badge")).to_have_text("KB")
    expect(kb.locator(".badge")).to_have_attribute(
        "title", "Answered from the knowledge base"
    )  # a user's reason
    expect(kb.locator(".target")).to_have_text(f"KB#{kb_and_slow_engine['entry'].pk}")
    expect(kb.locator(".bubble strong")).to_have_text("Forgot password")
    assert "**" not in kb.locator(".bubble").inner_text()
    expect(kb.locator(".timings")).to_contain_text("total")
    expect(kb.locator(".citations")).to_contain_text(f"KB#{kb_and_slow_engine['entry'].pk}")
    expect(page).to_have_url(re.compile(r"\?session=\d+$"))
    session_id = int(page.url.rsplit("=", 1)[1])

    # A thumbs down on the direct answer: pressed on the page, kept under the answer's key.
    thumbs_down = kb.locator('.feedback .verdict[data-verdict="down"]')
    expect(thumbs_down).to_be_visible()
    thumbs_down.click()
    expect(thumbs_down).to_have_attribute("aria-pressed", "true")
    # Pressed at once, and the button is held until the server has kept the verdict.
    expect(thumbs_down).to_be_enabled()
    expect(kb.locator('.verdict[data-verdict="up"]')).to_have_attribute("aria-pressed", "false")
    kb_message = Message.objects.get(pk=kb.get_attribute("data-message-id"))
    assert kb_message.verdict == "down"
    assert Feedback.objects.get(request_key=kb_message.request_key).verdict == "down"
    expect(page.locator(f'#sessions .session[data-session-id="{session_id}"]')).to_have_attribute(
        "aria-current", "true"
    )

    # A generated answer arrives token by token over the socket.
    generated = ask(page, "Tell me something about the sea")
    lengths = watch_text_grow(page, generated)
    assert len({n for n in lengths if n > 0}) >= 3, lengths
    assert finished(generated).get_attribute("data-status") == "complete"
    expect(generated.locator(".badge")).to_have_attribute("data-road", "local")
    expect(generated.locator(".target")).to_have_text("local")
    expect(generated.locator(".timings")).to_contain_text("first token")

    # Stop cancels the generation upstream: the engine is no longer decoding it.
    long = ask(page, "Write a long essay about rivers")
    expect(page.locator("#stop")).to_be_visible()
    expect(long.locator(".bubble")).not_to_be_empty(timeout=ANSWER_TIMEOUT)
    assert requests_running(slow_sim) == 1
    page.locator("#stop").click()
    finished(long)
    assert long.get_attribute("data-status") == "cancelled"
    expect(long.locator(".status-note")).to_have_text("Stopped.")
    expect(page.locator("#send")).to_be_visible()
    deadline = time.monotonic() + 10
    while requests_running(slow_sim) != 0:
        assert time.monotonic() < deadline, "the engine still decodes the stopped answer"
        time.sleep(0.1)

    # Markup in KB text (or model output) is shown as text and never runs.
    canary = finished(ask(page, XSS_QUESTION))
    expect(canary.locator(".bubble")).to_contain_text(
        '<script>alert(1)</script> and <img src=x onerror="alert(2)">'
    )
    expect(canary.locator(".bubble strong")).to_have_text("this is bold")
    assert page.locator("#messages script, #messages img, #messages [onerror]").count() == 0
    assert page.locator('#messages a[href^="javascript"]').count() == 0
    assert watched.dialogs == []

    stored = list(
        Message.objects.filter(session_id=session_id, role="assistant")
        .order_by("pk")
        .values_list("status", "road")
    )
    assert stored == [
        ("complete", "kb"),
        ("complete", "local"),
        ("cancelled", "local"),
        ("complete", "kb"),
    ]

    # After a reload the whole conversation comes back from the database.
    page.reload()
    expect(page.locator(".message.user")).to_have_count(4)
    answers = page.locator(".message.assistant")
    expect(answers).to_have_count(4)
    assert [answers.nth(i).get_attribute("data-status") for i in range(4)] == [
        "complete",
        "complete",
        "cancelled",
        "complete",
    ]
    assert [answers.nth(i).locator(".badge").get_attribute("data-road") for i in range(4)] == [
        "kb",
        "local",
        "local",
        "kb",
    ]
    expect(answers.nth(0).locator(".bubble strong")).to_have_text("Forgot password")
    expect(answers.nth(0).locator('.verdict[data-verdict="down"]')).to_have_attribute(
        "aria-pressed", "true"
    )  # the verdict given before the reload
    expect(answers.nth(1).locator(".bubble")).to_have_text(
        Message.objects.filter(session_id=session_id, role="assistant").order_by("pk")[1].content
    )
    expect(answers.nth(2).locator(".status-note")).to_contain_text("Stopped")
    expect(answers.nth(3).locator(".bubble")).to_contain_text("<script>alert(1)</script>")
    expect(page.locator(".message.user").nth(1)).to_have_text("Tell me something about the sea")
    assert page.locator("#messages script, #messages img").count() == 0
    assert watched.dialogs == []

    # New chat starts an empty conversation; its first answer makes a second session, listed first.
    page.locator("#new-chat").click()
    expect(page.locator(".message")).to_have_count(0)
    expect(page).to_have_url(re.compile(r"/$"))
    finished(ask(page, KB_QUESTION))
    sessions = page.locator("#sessions .session")
    expect(sessions).to_have_count(2)
    expect(sessions.first).to_have_attribute("aria-current", "true")
    assert int(sessions.nth(1).get_attribute("data-session-id")) == session_id
    assert ChatSession.objects.filter(user__username="alice").count() == 2


MARKDOWN_SCRIPTS = ["vendor/markdown-it.min.js", "vendor/purify.min.js", "markdown.js"]

# In an inert <template>, so markup from a broken renderer cannot fire an onerror here either.
CHECK_RENDERED = """(sources) => {
    const allowed = %ALLOWED%;
    const inert = (html) => {
        const t = document.createElement("template");
        t.innerHTML = html;
        return t.content;
    };
    const problems = [];
    for (const source of sources) {
        const shown = inert(GatewayMarkdown.render(source));
        for (const node of shown.querySelectorAll("*")) {
            const tag = node.tagName.toLowerCase();
            if (!(tag in allowed)) problems.push([source, "tag " + tag]);
            for (const attribute of node.attributes) {
                if (!(allowed[tag] || []).includes(attribute.name))
                    problems.push([source, tag + " " + attribute.name]);
                if (attribute.name === "href" && !/^https?:\\/\\//i.test(attribute.value))
                    problems.push([source, "href " + attribute.value]);
            }
        }
        // The sanitizer had nothing to take away: the renderer alone wrote only allowed markup.
        if (!shown.isEqualNode(inert(GatewayMarkdown.toHtml(source))))
            problems.push([source, "sanitizer changed it"]);
    }
    return problems;
}""".replace("%ALLOWED%", json.dumps({tag: sorted(attrs) for tag, attrs in ALLOWED.items()}))


def test_the_renderer_and_its_sanitizer_show_only_allowed_markup_in_chromium(browser):
    page = browser.new_page()
    try:
        for script in MARKDOWN_SCRIPTS:
            page.add_script_tag(path=str(BASE_DIR / "chat/static/chat" / script))
        assert page.evaluate("(source) => GatewayMarkdown.render(source)", "Use **this**.") == (
            "<p>Use <strong>this</strong>.</p>\n"
        )
        sources = (
            HOSTILE + [EXPLOIT[:i] for i in range(len(EXPLOIT))] + random_sources(1500, seed=7)
        )
        assert page.evaluate(CHECK_RENDERED, sources) == []
        # Without the sanitizer (a vendored file failed to load) the text is shown escaped, never
        # raw.
        page.evaluate("delete window.GatewayMarkdown; window.DOMPurify = undefined")
        page.add_script_tag(path=str(BASE_DIR / "chat/static/chat/markdown.js"))
        assert page.evaluate("(source) => GatewayMarkdown.render(source)", "<b>x</b> **y**") == (
            "<p>&lt;b&gt;x&lt;/b&gt; **y**</p>"
        )
    finally:
        page.close()


PWNING = [
    "- https://a/x/onmouseover=window.pwned=1//\n  https://e.com/$`",
    '<img src=x onerror="window.pwned=2">',
    "[click](javascript:window.pwned=3)",
    '[a](https://x.y/"onmouseover="window.pwned=4)',
    "| <script>window.pwned=5</script> | x |\n|---|---|\n| <svg onload=window.pwned=6> | y |",
    '```"><img src=x onerror=window.pwned=7>\ncode\n```',
    "# <iframe srcdoc='<script>parent.pwned=8</script>'>",
    "- a\n  - <b onclick=window.pwned=9>b</b>\n    - $& $' $`",
]
HOSTILE_QUESTION = "What does the hostile canary say?"


def assert_nothing_ran(watched):
    page = watched.page
    messages = page.locator("#messages")
    for link in messages.locator("a").all():
        link.hover()  # an onmouseover smuggled into a link would fire now
    page.wait_for_timeout(200)
    assert page.evaluate("window.pwned") is None
    assert watched.dialogs == []
    assert (
        messages.evaluate("""(root) => [...root.querySelectorAll("*")].flatMap((node) =>
        [...node.attributes].filter((a) => a.name.startsWith("on"))
            .map((a) => node.tagName + " " + a.name))""")
        == []
    )
    assert messages.locator("script, img, svg, iframe, style, object, embed").count() == 0
    hrefs = messages.evaluate(
        "(root) => [...root.querySelectorAll('a')].map((a) => a.getAttribute('href'))"
    )
    assert hrefs and all(re.match(r"https?://", href) for href in hrefs), hrefs


def test_a_hostile_answer_from_the_kb_or_a_model_is_shown_and_runs_nothing(open_page, local_sim):
    hostile = "\n\n".join(PWNING)
    entry_create(question=HOSTILE_QUESTION, answer=hostile, embed="sync")
    rule(
        "default",
        endpoint("local", local_sim),
        is_default=True,
        use_kb_context=False,
        max_tokens=2000,
    )
    user("mallory")
    watched = open_page()
    page = watched.page
    log_in(page, "mallory")

    kb = finished(ask(page, HOSTILE_QUESTION))
    assert kb.get_attribute("data-status") == "complete"
    expect(kb.locator(".bubble table")).to_have_count(1)
    expect(kb.locator(".bubble ul ul ul")).to_have_count(1)  # the list nested three deep
    expect(kb.locator(".bubble")).to_contain_text('<img src=x onerror="window.pwned=2">')
    assert_nothing_ran(watched)

    # The echoing engine streams the same text back token by token: every partial render is safe
    # too.
    generated = finished(ask(page, hostile))
    assert generated.get_attribute("data-status") == "complete"
    expect(generated.locator(".badge")).to_have_attribute("data-road", "local")
    expect(generated.locator(".bubble table")).to_have_count(1)
    assert_nothing_ran(watched)
    page.reload()
    expect(page.locator(".message.assistant")).to_have_count(2)
    assert_nothing_ran(watched)
    assert watched.violations() == []


def test_the_chat_page_enforces_its_content_security_policy(open_page):
    user("alice")
    watched = open_page()
    page = watched.page
    log_in(page, "alice")
    response = page.goto("/")
    policy = response.headers["content-security-policy"]
    assert (
        "script-src 'self'" in policy
        and "object-src 'none'" in policy
        and "unsafe-inline" not in policy
    )
    expect(page.locator("#connection")).to_have_attribute(
        "data-state", "open"
    )  # its WebSocket is allowed
    assert watched.violations() == []

    # Markup put into the page by any other way than the renderer still runs nothing: the policy
    # refuses it.
    page.evaluate("""() => {
        const box = document.createElement("div");
        box.innerHTML = '<img src="data:," onerror="window.pwned = 1">'
            + '<a href="#" onclick="window.pwned = 2">x</a>';
        document.body.append(box);
        box.querySelector("a").click();
        const script = document.createElement("script");
        script.textContent = "window.pwned = 3";
        document.body.append(script);
    }""")
    page.wait_for_timeout(200)
    assert page.evaluate("window.pwned") is None
    refused = page.evaluate("window.__violations")
    assert len(refused) == 3 and all(v.startswith("script-src") for v in refused), refused
    watched.console_violations.clear()  # these refusals were the point


def test_the_admin_and_the_api_docs_work_under_the_policy(open_page, server):
    admin = user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    entry = entry_create(question=KB_QUESTION, answer="Use **Forgot password**.", embed="none")
    watched = open_page()
    page = watched.page
    page.goto("/admin/")
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#site-name")).to_be_visible()
    for url in [
        "/admin/",
        "/admin/knowledge/entry/",
        "/admin/knowledge/entry/add/",
        f"/admin/knowledge/entry/{entry.pk}/change/",
        "/admin/knowledge/entry/try/?q=password",
        "/admin/routing/routingrule/tester/",
        "/admin/auth/user/",
    ]:
        response = page.goto(url)
        assert response.status == 200, url
        assert "script-src 'self'" in response.headers["content-security-policy"], url
        assert watched.violations() == [], url
    # The admin's own scripts run: the inline formset adds a row, the changelist selects all.
    page.goto("/admin/routing/routingrule/add/")
    rows = page.locator(".dynamic-targets, tr.form-row:not(.empty-form)")
    before = rows.count()
    page.locator(".add-row a").first.click()
    expect(rows).to_have_count(before + 1)
    page.goto("/admin/knowledge/entry/")
    page.locator("#action-toggle").check()
    expect(page.locator(".action-counter")).to_contain_text("1 of 1 selected")
    assert watched.violations() == []

    # Swagger UI renders the schema from the page's own script files.
    response = page.goto("/api/docs/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator(".swagger-ui .info .title")).to_contain_text(
        "Answering gateway API", timeout=30_000
    )
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    assert watched.violations() == []


def test_the_enter_that_confirms_an_ime_composition_does_not_send(open_page, kb_and_slow_engine):
    user("mei")
    page = open_page().page
    log_in(page, "mei")
    composer = page.locator("#composer")
    composer.fill("如何重置密码")

    # Chromium marks the Enter that picks an IME candidate with isComposing (keyCode 229).
    composer.evaluate("""(el) => el.dispatchEvent(new KeyboardEvent("keydown",
        {key: "Enter", code: "Enter", isComposing: true, bubbles: true, cancelable: true}))""")
    composer.evaluate("""(el) => el.dispatchEvent(new KeyboardEvent("keydown",
        {key: "Enter", code: "Enter", keyCode: 229, bubbles: true, cancelable: true}))""")
    # Between compositionstart and compositionend no Enter sends either.
    composer.evaluate(
        "(el) => el.dispatchEvent(new CompositionEvent('compositionstart', {data: ''}))"
    )
    composer.press("Enter")
    page.wait_for_timeout(300)
    expect(page.locator(".message")).to_have_count(0)
    assert Message.objects.count() == 0
    composer.evaluate(
        "(el) => el.dispatchEvent(new CompositionEvent('compositionend', {data: '密码'}))"
    )

    # Shift+Enter adds a line; a plain Enter then sends.
    composer.press("End")
    composer.press("Shift+Enter")
    expect(composer).to_have_value(re.compile("如何重置密码\n"))
    expect(page.locator(".message")).to_have_count(0)
    composer.fill(KB_QUESTION)
    composer.press("Enter")
    expect(page.locator(".message.user")).to_have_text(KB_QUESTION)
    expect(composer).to_have_value("")
    assert finished(page.locator(".message.assistant")).get_attribute("data-status") == "complete"


def test_an_error_frame_is_shown_on_the_answer(open_page):
    user("erin")  # no routing rule at all: a generated answer has no road
    page = open_page().page
    log_in(page, "erin")
    answer = finished(ask(page, "Is there anybody out there?"))
    assert answer.get_attribute("data-status") == "failed"
    expect(answer.locator(".status-note")).to_contain_text("No routing rule matches")
    expect(page.locator("#send")).to_be_visible()


def test_at_phone_width_the_composer_shows_and_the_sessions_sit_behind_a_button(open_page):
    alice = user("alice")
    ChatSession.objects.create(user=alice, title="Earlier chat")
    page = open_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True).page
    log_in(page, "alice")
    expect(page.locator("#composer")).to_be_visible()
    expect(page.locator("#send")).to_be_visible()
    expect(page.locator("#sessions-toggle")).to_be_visible()
    expect(page.locator("#sessions")).to_be_hidden()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

    page.locator("#sessions-toggle").click()
    expect(page.locator("#sessions-toggle")).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("button", name="Earlier chat", exact=True)).to_be_visible()
    page.get_by_role(
        "button", name="Earlier chat", exact=True
    ).click()  # opening a chat folds the list away
    expect(page.locator("#sessions")).to_be_hidden()
    expect(page.locator("#conversation-title")).to_have_text("Earlier chat")


def test_a_user_renames_and_deletes_sessions_and_a_second_user_sees_none_of_them(open_page):
    alice = user("alice")
    user("bob")
    first = ChatSession.objects.create(user=alice, title="First chat")
    second = ChatSession.objects.create(user=alice, title="Second chat")
    Message.objects.create(session=first, role="user", content="hello there")
    Message.objects.create(
        session=first,
        role="assistant",
        content="*Hi*",
        status="complete",
        road="kb",
        target="KB#1",
        ttft_ms=3.0,
        latency_ms=3.0,
    )
    page = open_page().page
    log_in(page, "alice")
    items = page.locator("#sessions .session")
    expect(items).to_have_count(2)

    page.get_by_role("button", name="First chat", exact=True).click()
    expect(page.locator(".message")).to_have_count(2)
    expect(page.locator(".message.assistant .bubble em")).to_have_text("Hi")

    page.get_by_role("button", name="Rename chat: First chat").click()
    page.get_by_label("New title").fill("Renamed chat")
    page.get_by_label("New title").press("Enter")
    expect(page.get_by_role("button", name="Renamed chat", exact=True)).to_be_visible()
    expect(page.locator("#conversation-title")).to_have_text("Renamed chat")
    first.refresh_from_db()
    assert first.title == "Renamed chat"

    delete = page.get_by_role("button", name="Delete chat: Second chat")
    delete.click()  # arms
    expect(items).to_have_count(2)
    page.locator(f'.session[data-session-id="{second.pk}"] [data-action="delete"]').click()
    expect(items).to_have_count(1)
    assert not ChatSession.objects.filter(pk=second.pk).exists()

    # Deleting the open chat leaves a new, empty one.
    page.locator(f'.session[data-session-id="{first.pk}"] [data-action="delete"]').click()
    page.locator(f'.session[data-session-id="{first.pk}"] [data-action="delete"]').click()
    expect(items).to_have_count(0)
    expect(page.locator("#conversation-title")).to_have_text("New chat")
    expect(page.locator(".message")).to_have_count(0)

    # Bob sees no chat of Alice's, not even by its address.
    kept = ChatSession.objects.create(user=alice, title="Alice only")
    other = open_page().page
    log_in(other, "bob")
    expect(other.locator("#sessions-empty")).to_be_visible()
    other.goto(f"/?session={kept.pk}")
    expect(other.locator("#banner")).to_contain_text("does not exist")
    expect(other.locator(".message")).to_have_count(0)
    expect(other.locator("#sessions .session")).to_have_count(0)


def test_a_dropped_connection_reconnects_and_shows_the_answer_from_the_database(
    open_page, kb_and_slow_engine
):
    user("alice")
    page = open_page().page
    routes = []

    def relay(route):
        server_side = route.connect_to_server()  # frames pass through untouched
        routes.append((route, server_side))

    page.route_web_socket(re.compile(r"/ws/chat/$"), relay)
    log_in(page, "alice")
    answer = ask(page, "Tell me something about mountains")
    expect(answer.locator(".bubble")).not_to_be_empty(timeout=ANSWER_TIMEOUT)
    page_side, server_side = routes[-1]
    server_side.close()
    page_side.close(code=4000, reason="network went away")

    expect(page.locator("#connection")).not_to_have_attribute("data-state", "open", timeout=5_000)
    expect(page.locator("#connection")).to_have_attribute("data-state", "open", timeout=20_000)
    assert len(routes) == 2
    stored = Message.objects.get(role="assistant")
    answer = page.locator(".message.assistant")
    expect(answer).to_have_count(1)
    expect(answer).not_to_have_attribute("data-status", "streaming", timeout=20_000)
    stored.refresh_from_db()
    assert stored.status != "streaming"
    expect(answer).to_have_attribute("data-status", stored.status)
    expect(answer.locator(".bubble")).to_have_text(stored.content)
    expect(page.locator(".message.user")).to_have_text("Tell me something about mountains")


def text_beyond(answer, length, timeout_ms=20_000):
    """Wait until the answer's text (as the page keeps it) is longer than `length`; returns it."""
    return answer.evaluate(
        """async (el, [length, timeout]) => {
            const until = Date.now() + timeout;
            while ((el._text || "").length <= length && Date.now() < until) {
                await new Promise((resolve) => setTimeout(resolve, 30));
            }
            return el._text || "";
        }""",
        [length, timeout_ms],
    )


def test_a_reload_mid_answer_continues_it_a_second_tab_sees_it_and_stops_it(
    open_page, kb_and_slow_engine, slow_sim
):
    user("erin")
    watched = open_page()
    page = watched.page
    log_in(page, "erin")
    long = ask(page, "Write a long essay about rivers")
    before = text_beyond(long, 20)
    expect(page).to_have_url(re.compile(r"\?session=\d+$"))
    session_id = int(page.url.rsplit("=", 1)[1])

    # Reloaded mid-answer: the page joins the answer, shows what was written meanwhile, and the
    # text goes on growing from there.
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "open")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(page.locator("#stop")).to_be_visible()
    after = text_beyond(answer, len(before) + 40)
    assert after.startswith(before), (before, after)

    # A second tab of the same login sees the same answer, live, and its Stop ends it for both.
    second = page.context.new_page()
    second.goto(f"/?session={session_id}")
    other = second.locator(".message.assistant").last
    expect(other).to_have_attribute("data-status", "streaming")
    text_beyond(other, len(after))
    second.locator("#stop").click()
    finished(other)
    finished(answer)
    assert other.get_attribute("data-status") == "cancelled"
    assert answer.get_attribute("data-status") == "cancelled"
    stored = Message.objects.get(session_id=session_id, role="assistant")
    assert stored.status == "cancelled"
    # Every token exactly once, on both pages.
    assert answer.evaluate("(el) => el._text") == stored.content
    assert other.evaluate("(el) => el._text") == stored.content
    deadline = time.monotonic() + 10
    while requests_running(slow_sim) != 0:
        assert time.monotonic() < deadline, "the engine still decodes the stopped answer"
        time.sleep(0.1)


def test_a_user_creates_copies_and_revokes_an_api_key(open_page):
    alice = user("alice")
    page = open_page().page
    log_in(page, "alice")
    page.get_by_role("link", name="API keys").click()
    expect(page).to_have_url(re.compile(r"/keys/$"))
    expect(page.locator("#keys-empty")).to_be_visible()

    expect(page.locator('input[name="scopes"]')).to_have_count(1)  # the kb scope is for staff
    page.get_by_label("Name").fill("support-bot")
    page.get_by_role("button", name="Create key").click()
    raw = page.locator("#new-key-value")
    expect(raw).to_have_value(re.compile(r"^gw_"))
    key = ApiKey.objects.get(user=alice)
    assert ApiKey.hash(raw.input_value()) == key.key_hash
    row = page.locator(f'#keys tr[data-key-id="{key.pk}"]')
    expect(row.locator(".key-name")).to_have_text("support-bot")
    expect(row.locator(".key-scopes")).to_have_text("chat")
    expect(row.locator(".key-prefix")).to_contain_text(key.prefix)

    # Shown once: a reload lists the key by its prefix only.
    page.reload()
    expect(row).to_be_visible()
    expect(page.locator("#new-key")).to_be_hidden()
    assert raw.input_value() == ""

    # A name already in use is refused with the server's message.
    page.get_by_label("Name").fill("support-bot")
    page.get_by_role("button", name="Create key").click()
    expect(page.locator("#keys-error")).to_be_visible()
    expect(page.locator("#keys-error")).to_contain_text("not created")

    row.get_by_role("button", name="Revoke key support-bot").click()
    row.locator('[data-action="revoke"]').click()
    expect(row).to_have_attribute("data-revoked", "true")
    expect(row.locator(".state")).to_contain_text("revoked")
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_the_chat_needs_a_login_and_logging_out_ends_it(open_page):
    user("alice")
    page = open_page().page
    page.goto("/keys/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/keys/$"))
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#login-error")).to_be_visible()

    log_in(page, "alice")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
