"""The chat page's features beyond asking, in a real browser (the fixtures and helpers of
test_browser.py): regenerating an answer, editing the last question, the versions of an answer,
copying an answer's Markdown, and searching one's chats, Chinese included."""

import re

import pytest
from playwright.sync_api import expect

from chat.models import ChatSession, Message
from knowledge.services.entries import entry_create
from tests.chat import test_browser
from tests.chat.test_browser import KB_QUESTION, ask, finished, log_in, user
from tests.support.factories import endpoint, rule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

KB_ANSWER = "Use **Forgot password** on the login page."

# The browser, the server and the pages of test_browser.py, shared.
browser = test_browser.browser
server = test_browser.server
open_page = test_browser.open_page


@pytest.fixture
def kb_and_echo(local_sim):
    """A KB entry, and the echoing local engine for every other question."""
    entry_create(question=KB_QUESTION, answer=KB_ANSWER, embed="sync")
    rule("default", endpoint("local", local_sim), is_default=True, use_kb_context=False)


def versions(answer):
    return answer.locator(".versions")


def test_a_user_regenerates_the_last_answer_browses_its_versions_and_edits_the_question(
    open_page, kb_and_echo
):
    user("alice")
    page = open_page(permissions=["clipboard-read", "clipboard-write"]).page
    log_in(page, "alice")
    answers = page.locator(".message.assistant")
    questions = page.locator(".message.user")

    kb = finished(ask(page, KB_QUESTION))
    expect(kb.get_by_role("button", name="Answer the question again")).to_be_visible()
    expect(questions.nth(0).get_by_role("button", name="Edit your question")).to_be_visible()

    # Copy puts the answer's Markdown on the clipboard, and says so.
    kb.get_by_role("button", name="Copy the answer's Markdown").click()
    expect(kb.locator(".copied")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == KB_ANSWER

    # A second exchange: only its answer and question may be redone.
    first = finished(ask(page, "Tell me about the sea"))
    expect(first.locator(".bubble")).to_have_text("Tell me about the sea")
    expect(kb.locator(".regenerate")).to_be_hidden()
    expect(questions.nth(0).locator(".edit")).to_be_hidden()
    expect(versions(first)).to_be_hidden()

    # Regenerate: a new answer streams in its place, and the answer now has two versions.
    first.get_by_role("button", name="Answer the question again").click()
    regenerated = answers.nth(1)
    expect(regenerated).to_have_attribute("data-status", "complete", timeout=60_000)
    expect(versions(regenerated).locator(".version-label")).to_have_text("2/2")
    expect(versions(regenerated).locator(".version-state")).to_have_text("current")
    expect(answers).to_have_count(2)
    stored = list(
        Message.objects.filter(role="assistant", content="Tell me about the sea")
        .order_by("pk")
        .values_list("pk", "superseded", "version_of")
    )
    assert len(stored) == 2 and stored[0][1] is True and stored[1][1:] == (False, stored[0][0])
    assert regenerated.get_attribute("data-message-id") == str(stored[1][0])

    # ‹ shows the earlier version, which cannot be regenerated; › comes back to the current one.
    regenerated.get_by_role("button", name="Earlier version").click()
    shown = answers.nth(1)
    expect(versions(shown).locator(".version-label")).to_have_text("1/2")
    expect(versions(shown).locator(".version-state")).to_have_text("earlier version")
    assert shown.get_attribute("data-message-id") == str(stored[0][0])
    expect(shown.locator(".regenerate")).to_be_hidden()
    expect(questions.nth(1).locator(".edit")).to_be_hidden()
    shown.get_by_role("button", name="Later version").click()
    expect(versions(answers.nth(1)).locator(".version-label")).to_have_text("2/2")

    # Edit the last question and send it: a new question and its answer, a third version.
    questions.nth(1).get_by_role("button", name="Edit your question").click()
    editor = questions.nth(1).get_by_label("Your edited question")
    expect(editor).to_have_value("Tell me about the sea")
    editor.fill("Tell me about the lakes")
    editor.press("Enter")
    expect(answers.nth(1)).to_have_attribute("data-status", "complete", timeout=60_000)
    expect(answers.nth(1).locator(".bubble")).to_have_text("Tell me about the lakes")
    expect(versions(answers.nth(1)).locator(".version-label")).to_have_text("3/3")
    expect(questions.nth(1).locator(".bubble")).to_have_text("Tell me about the lakes")
    expect(questions).to_have_count(2)
    # The earlier versions show the question they answered.
    answers.nth(1).get_by_role("button", name="Earlier version").click()
    expect(questions.nth(1).locator(".bubble")).to_have_text("Tell me about the sea")
    expect(answers.nth(1).locator(".bubble")).to_have_text("Tell me about the sea")

    # After a reload the versions come back from the database, the current one on screen.
    page.reload()
    expect(versions(answers.nth(1)).locator(".version-label")).to_have_text("3/3")
    expect(questions.nth(1).locator(".bubble")).to_have_text("Tell me about the lakes")
    expect(answers.nth(1).locator(".regenerate")).to_be_visible()
    assert Message.objects.filter(superseded=False).count() == 4
    assert Message.objects.filter(superseded=True).count() == 3  # two answers and a question


def test_a_regenerate_the_server_refuses_shows_why_and_keeps_the_answer(open_page, kb_and_echo):
    user("alice")
    page = open_page().page
    log_in(page, "alice")
    answer = finished(ask(page, "Tell me about the sea"))
    # Another tab asked meanwhile: this answer is no longer the last.
    session = ChatSession.objects.get()
    Message.objects.create(session=session, role="user", content="Elsewhere")
    Message.objects.create(session=session, role="assistant", content="Answered elsewhere")

    answer.get_by_role("button", name="Answer the question again").click()

    expect(page.locator("#banner")).to_contain_text("Only the last answer can be regenerated")
    answers = page.locator(".message.assistant")
    expect(answers).to_have_count(2)  # the thread as the database has it
    expect(answers.nth(0).locator(".bubble")).to_have_text("Tell me about the sea")
    expect(answers.nth(1).locator(".regenerate")).to_be_visible()
    assert not Message.objects.filter(superseded=True).exists()


@pytest.fixture
def chats():
    """Alice's chats, one in Chinese deep in a long conversation, and Bob's about the same."""
    alice, bob = user("alice"), user("bob")
    trip = ChatSession.objects.create(user=alice, title="Trip")
    Message.objects.create(session=trip, role="user", content="Which trains run to the Alps?")
    password = ChatSession.objects.create(user=alice, title="Account help")
    for n in range(12):
        Message.objects.create(session=password, role="user", content=f"Question {n} " * 20)
        Message.objects.create(session=password, role="assistant", content=f"Answer {n} " * 40)
    found = Message.objects.create(
        session=password, role="assistant", content="在登录页点击“忘记密码”即可重置密码。"
    )
    for n in range(12, 20):
        Message.objects.create(session=password, role="user", content=f"Question {n} " * 20)
    theirs = ChatSession.objects.create(user=bob, title="Bob's secrets")
    Message.objects.create(session=theirs, role="user", content="重置密码 for the Alps")
    return {"found": found, "password": password}


def test_a_user_searches_their_chats_and_opens_one_at_the_message(open_page, chats):
    page = open_page().page
    log_in(page, "alice")
    search = page.get_by_label("Search your chats")

    search.fill("重置密码")
    search.press("Enter")
    hits = page.locator("#search-results .search-hit")
    expect(hits).to_have_count(1)
    expect(page.locator("#search-status")).to_have_text("1 message")
    expect(hits.first.locator(".search-title")).to_have_text("Account help · answer")
    expect(hits.first.locator(".search-snippet")).to_have_text(
        "在登录页点击“忘记密码”即可重置密码。"
    )
    expect(hits.first.locator("mark")).to_have_text("重置密码")

    hits.first.locator("button").click()
    expect(page).to_have_url(re.compile(rf"\?session={chats['password'].pk}$"))
    expect(page.locator("#conversation-title")).to_have_text("Account help")
    target = page.locator(f'.message[data-message-id="{chats["found"].pk}"]')
    expect(target).to_have_class(re.compile(r"\bfound\b"))
    expect(target).to_be_in_viewport()
    expect(page.locator(".message").last).not_to_be_in_viewport()  # opened at the message

    # Words in any case; each of them marked.
    search.fill("alps TRAINS")
    search.press("Enter")
    expect(hits).to_have_count(1)
    expect(hits.first.locator("mark")).to_have_text(["trains", "Alps"])

    # An empty search is refused with the server's message; nothing found says so.
    search.fill("   ")
    search.press("Enter")
    expect(page.locator("#search-status")).to_have_text("Type something to search for.")
    search.fill("submarine")
    search.press("Enter")
    expect(page.locator("#search-status")).to_have_text("Nothing found.")
    expect(hits).to_have_count(0)
    page.get_by_role("button", name="Close the results").click()
    expect(page.locator("#search-box")).to_be_hidden()

    # Bob finds his own message, never Alice's.
    other = open_page().page
    log_in(other, "bob")
    other.get_by_label("Search your chats").fill("重置密码")
    other.get_by_label("Search your chats").press("Enter")
    expect(other.locator("#search-results .search-hit")).to_have_count(1)
    expect(other.locator(".search-title")).to_have_text("Bob's secrets · you")
