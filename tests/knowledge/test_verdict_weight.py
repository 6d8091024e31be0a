"""People's verdicts count once per person and question (the answers of one normalized question
with one entry): users ask through the chat API and rate through the verdict API the chat page
uses, curators judge in the admin and calibrate from traffic there. One user's thumbs, however
many, steer neither calibration nor the review queue beyond one verdict; a curator's verdict
decides its question, for everyone who judged it; past a daily allowance a user's thumbs down
are kept but queue nothing."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from knowledge.hits import hit_flush, review_queue
from knowledge.models import Calibration, Feedback, Hit
from knowledge.selectors import serving_model_forget
from knowledge.typos import index_forget
from tests.support.factories import rule

pytestmark = pytest.mark.django_db

PASSWORD = "How do I reset my password?"
HOURS = "What are your opening hours?"
LORA = "What is LoRA?"
QLORA = "What is QLoRA?"
OTHERS = [
    LORA,
    QLORA,
    HOURS,
    "How do I cancel my subscription?",
    "How do I cancel my order?",
]


@pytest.fixture(autouse=True)
def _records(settings):
    """Direct answers kept, written by the test itself (in its transaction)."""
    settings.KB_RECORD_HITS = True
    settings.KB_MISS_FLUSH_SECONDS = 3600
    yield
    hit_flush()
    serving_model_forget()
    index_forget()


@pytest.fixture
def person(django_user_model):
    def make(name):
        user = django_user_model.objects.create_user(name, password=f"pw-{name}-123456")
        api = APIClient()
        api.force_login(user)
        return api

    return make


@pytest.fixture
def ask(kb):
    """A question through the chat API: the id of its answer, a direct one from the KB."""
    index_forget()  # the typo index of this test's KB
    rule("default", is_default=True, action="kb_only")

    def ask(api, question):
        session = api.post("/api/chat/sessions/", {}, format="json").json()["id"]
        reply = api.post(
            f"/api/chat/sessions/{session}/messages/", {"content": question}, format="json"
        )
        assert reply.status_code == 201, reply.content
        answer = reply.json()["assistant_message"]
        assert answer["road"] == "kb", answer
        return answer["id"]

    return ask


def rate(api, message_id, verdict) -> dict:
    """The verdict API the chat page posts to."""
    reply = api.post(
        f"/api/chat/messages/{message_id}/feedback", {"verdict": verdict}, format="json"
    )
    assert reply.status_code == 200, reply.content
    return reply.json()


def calibrate(curator_client, target: str) -> Calibration:
    """The admin's "Calibrate from traffic": the run it saved."""
    made = curator_client.post(
        "/admin/knowledge/calibration/from-traffic/", {"days": "7", "target": target}
    )
    run = Calibration.objects.get()
    assert made.status_code == 302 and made["Location"].endswith(f"/calibration/{run.pk}/change/")
    return run


def test_five_thumbs_down_by_one_user_on_an_exact_match_count_as_one_in_calibration(
    ask, person, curator_client
):
    alice, bob = person("alice"), person("bob")
    for _ in range(5):
        assert rate(alice, ask(alice, PASSWORD), "down")["verdict"] == "down"
    for question in OTHERS:
        rate(bob, ask(bob, question), "up")
    hit_flush()
    assert Feedback.objects.filter(verdict="down").count() == 5  # every verdict is kept

    run = calibrate(curator_client, "0.8")
    # An exact match answers at every operating point: counted per answer, five wrong against
    # five right put every point at 0.5 and none reached 0.8. Counted once: 5 right, 1 wrong.
    assert run.source == "traffic: last 7 day(s), 10 questions, 6 judged"
    assert run.threshold is not None and run.precision == pytest.approx(5 / 6)
    assert [row["question"] for row in run.wrong] == [PASSWORD]
    assert PASSWORD in curator_client.get(f"/admin/knowledge/calibration/{run.pk}/change/").text


def test_a_curators_verdict_outweighs_many_users_verdicts_on_its_question(
    ask, person, curator_client
):
    users = [person(f"user{i}") for i in range(5)]
    for api in users:
        rate(api, ask(api, HOURS), "up")
    for _ in range(5):  # and one of them upvotes it again and again
        rate(users[0], ask(users[0], HOURS), "up")
    for api in users[1:]:
        rate(api, ask(api, LORA), "down")
    for api in users[:2]:
        rate(api, ask(api, QLORA), "up")
    hit_flush()

    def judge(question, action):
        hit = Hit.objects.filter(question=question).first()
        acted = curator_client.post(
            "/admin/knowledge/hit/", {"action": action, "_selected_action": [hit.pk]}
        )
        assert acted.status_code == 302

    # The curator marks one answer of two questions, against what their users said.
    judge(HOURS, "mark_wrong")
    judge(LORA, "mark_right")

    run = calibrate(curator_client, "0.5")
    # The curator's verdict stands for each person's on the question: the opening hours wrong
    # five times (five people, one of them six times), LoRA right four times; QLoRA's two thumbs
    # up as given. Counted per answer, the users outweighed the curator: 12 right, 4 wrong.
    assert run.source == "traffic: last 7 day(s), 16 questions, 11 judged"
    assert run.precision == pytest.approx(6 / 11)
    assert [row["question"] for row in run.wrong] == [HOURS] * 5


def test_one_users_thumbs_down_do_not_flood_the_review_queue(ask, person, curator_client, settings):
    settings.KB_REVIEW_DOWNVOTES_PER_DAY = 3
    alice, bob, carol = person("alice"), person("bob"), person("carol")
    # Five thumbs down on one question: three within alice's allowance, two past it; then one on
    # another question, past it too. Every verdict is kept; the last three say they queue nothing.
    replies = [rate(alice, ask(alice, PASSWORD), "down") for _ in range(5)]
    replies.append(rate(alice, ask(alice, LORA), "down"))
    assert [r["verdict"] for r in replies] == ["down"] * 6
    assert [r["note"] for r in replies[:3]] == ["", "", ""]
    assert all("goes to no reviewer" in r["note"] for r in replies[3:])
    assert Feedback.objects.filter(verdict="down").count() == 6
    hit_flush()

    # One row for the question, one person reporting it; the question past the allowance waits
    # for no one.
    assert [(h.question, h.reports) for h in review_queue()] == [(PASSWORD, 1)]

    # Bob's thumbs down queue LoRA and raise the password question's priority: two people.
    for question in (LORA, PASSWORD):
        assert rate(bob, ask(bob, question), "down")["note"] == ""
    hit_flush()
    assert [(h.question, h.reports) for h in review_queue()] == [(PASSWORD, 2), (LORA, 1)]
    page = curator_client.get("/admin/knowledge/hit/?queue=open").text
    assert page.count('name="_selected_action"') == 2  # one row a question, not eight
    assert page.index(PASSWORD) < page.index(LORA)  # the most reported first

    # A curator's verdict settles the question: later thumbs down do not bring it back.
    password = next(h for h in review_queue() if h.question == PASSWORD)
    curator_client.post(
        "/admin/knowledge/hit/", {"action": "mark_right", "_selected_action": [password.pk]}
    )
    assert rate(carol, ask(carol, PASSWORD), "down")["note"] == ""
    hit_flush()
    assert [(h.question, h.reports) for h in review_queue()] == [(LORA, 1)]


def test_the_allowance_counts_the_thumbs_down_of_the_last_24_hours(ask, person, settings):
    settings.KB_REVIEW_DOWNVOTES_PER_DAY = 1
    alice = person("alice")
    hours = ask(alice, HOURS)
    assert rate(alice, hours, "up")["note"] == ""  # a thumbs up uses none of it
    assert rate(alice, ask(alice, PASSWORD), "down")["note"] == ""
    # A verdict turned down counts as a new thumbs down: past the allowance.
    assert "goes to no reviewer" in rate(alice, hours, "down")["note"]
    # A day later, the allowance is whole again (the thumbs down queued then stays queued).
    Feedback.objects.filter(queued=True).update(updated_at=timezone.now() - timedelta(hours=25))
    assert rate(alice, ask(alice, LORA), "down")["note"] == ""
    hit_flush()
    assert {h.question for h in review_queue()} == {LORA, PASSWORD}


def test_a_thumbs_down_on_a_models_answer_uses_none_of_the_allowance(person, product, settings):
    settings.KB_REVIEW_DOWNVOTES_PER_DAY = 1
    alice = person("alice")
    session = alice.post("/api/chat/sessions/", {}, format="json").json()["id"]

    def answer(question):
        reply = alice.post(
            f"/api/chat/sessions/{session}/messages/", {"content": question}, format="json"
        )
        assert reply.status_code == 201, reply.content
        return reply.json()["assistant_message"]

    generated = answer("Write a haiku about the sea.")
    assert generated["road"] == "local"
    assert rate(alice, generated["id"], "down")["note"] == ""
    direct = answer(PASSWORD)
    assert direct["road"] == "kb"
    assert rate(alice, direct["id"], "down")["note"] == ""  # the allowance was still whole
    hit_flush()
    assert [h.question for h in review_queue()] == [PASSWORD]
    assert Feedback.objects.filter(verdict="down").count() == 2
