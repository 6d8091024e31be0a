"""Calibration from traffic: the last days' direct answers and misses, replayed with the vectors
their requests computed and the verdicts people gave, from the command line and the admin."""

import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command

from knowledge.calibration_traffic import calibrate_from_traffic, traffic_read
from knowledge.hits import hit_flush
from knowledge.misses import miss_flush
from knowledge.models import Calibration, Feedback, Hit, Miss
from knowledge.selectors import serving_model, serving_model_forget
from knowledge.typos import index_forget
from tests.support.answers import ask
from tests.support.factories import rule
from tests.support.personas import client_of

pytestmark = pytest.mark.django_db

TRAFFIC = [
    "How do I reset my password?",  # exact
    "how do I resett my password",  # a typo
    "I forgot my password",
    "how can I cancel an order I placed",
    "cancel my subscription plan",
    "怎么取消订单呢",
    "How do I cancel my membership?",
    "tell me about LoRA adapters",
    "what is the weather today",
    "explain LoRA",
]


@pytest.fixture(autouse=True)
def _records(settings):
    """Both KB records on, written by the test itself (in its transaction)."""
    settings.KB_RECORD_HITS = settings.KB_RECORD_MISSES = True
    settings.KB_MISS_FLUSH_SECONDS = 3600
    yield
    hit_flush()
    miss_flush()
    serving_model_forget()
    index_forget()


@pytest.fixture
def traffic(kb, settings):
    """Every question of TRAFFIC through the pipeline once, at a loose operating point so the
    vector road answers some of them; a KB-only default rule notes the rest as misses."""
    settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN = 0.88, 0.0
    serving_model_forget()
    index_forget()  # the typo index of this test's KB, not one an earlier test left in memory
    rule("default", is_default=True, action="kb_only")
    live = {}
    for question in TRAFFIC:
        events = ask(question, key=uuid.uuid4())
        done = events[-1]
        live[question] = done.kb_entry_id if done.road == "kb" and done.rule is None else None
    hit_flush()
    miss_flush()
    return live


def test_each_question_is_kept_once_with_the_vector_its_request_computed(traffic):
    assert Hit.objects.count() + Miss.objects.count() == len(TRAFFIC)
    hits = {h.question: h for h in Hit.objects.all()}
    assert {q for q, entry in traffic.items() if entry} == set(hits)
    assert hits["How do I reset my password?"].method == "exact"
    assert hits["how do I resett my password"].method == "typo"
    for hit in hits.values():
        assert (hit.embedding is None) == (hit.method in ("exact", "typo")), hit.question
    assert all(m.embedding is not None for m in Miss.objects.all())


def test_the_replay_gives_the_live_answer_without_embedding_again(traffic, settings):
    model = serving_model()
    items = traffic_read(days=7, model=model)
    assert len(items) == len(TRAFFIC)
    assert all(i.vector is not None for i in items if i.kind in ("miss", "direct (vector)"))
    result = calibrate_from_traffic(days=7)
    for ev in result.evidence:
        got = ev.answer(settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN)
        assert got == traffic[ev.item.question], ev.item.question
    # No one has judged anything: no precision to measure, recall 0, the hit rate is the live one.
    point = next(
        p
        for p in result.points
        if (p.threshold, p.margin) == (settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN)
    )
    assert (point.correct, point.wrong) == (0, 0)
    assert point.hit_rate == pytest.approx(sum(map(bool, traffic.values())) / len(TRAFFIC))


# At the loose point the vector road answers two near misses with the wrong entry.
WRONG = ["How do I cancel my membership?", "tell me about LoRA adapters"]


def test_verdicts_steer_the_recommendation_away_from_the_answers_people_marked_wrong(
    traffic, settings, kb
):
    assert all(traffic[q] for q in WRONG)
    for hit in Hit.objects.all():
        verdict = "down" if hit.question in WRONG else "up"
        Feedback.objects.create(request_key=hit.key, verdict=verdict, interface="web")
    # A curator overrules one user: the LoRA question was answered well after all...
    lora = Hit.objects.get(question="tell me about LoRA adapters")
    lora.review = "right"
    lora.save()
    # ...and another thumbs down is upheld; the weather group was dismissed.
    Miss.objects.filter(question="what is the weather today").update(
        dismissed_at="2026-01-01T00:00Z"
    )

    result = calibrate_from_traffic(days=7, target=0.98)
    live = next(
        p for p in result.points if (p.threshold, p.margin) == (settings.KB_DIRECT_THRESHOLD, 0.0)
    )
    assert (live.correct, live.wrong) == (8, 1)  # the thumbs down counts against the live point
    assert live.precision == pytest.approx(8 / 9)
    chosen = result.chosen
    assert chosen is not None and chosen.wrong == 0 and chosen.precision == 1.0
    by_question = {ev.item.question: ev for ev in result.evidence}
    assert by_question[WRONG[0]].answer(chosen.threshold, chosen.margin) is None
    # Every answer people (or the curator) called right stays answered.
    assert chosen.correct == 8 and chosen.recall == 1.0
    assert result.answerable == 8  # the weather is judged, with nothing that answers it
    assert chosen.hit_rate == pytest.approx(8 / len(TRAFFIC))


def test_a_miss_a_curator_attached_to_an_entry_is_answerable_by_it(traffic, kb):
    Miss.objects.filter(question="what is the weather today").update(
        resolved_by=kb["What are your opening hours?"]
    )
    items = {i.question: i for i in traffic_read(days=7, model=serving_model())}
    weather = items["what is the weather today"]
    assert weather.judged and weather.expected == kb["What are your opening hours?"].pk
    assert not items["I forgot my password"].judged  # no one said


def test_kb_calibrate_from_log_prints_the_operating_points_and_saves_the_run(traffic, capsys):
    call_command("kb_calibrate", "--from-log", "--days", "3")
    out = capsys.readouterr().out
    assert f"traffic: last 3 day(s), {len(TRAFFIC)} questions, 0 judged" in out
    assert "hit rate" in out and "at the serving point: precision 1.000" in out
    run = Calibration.objects.get()
    assert run.source.startswith("traffic: last 3 day(s)") and not run.applied
    with pytest.raises(CommandError, match="one of them"):
        call_command("kb_calibrate")
    with pytest.raises(CommandError, match="one of them"):
        call_command("kb_calibrate", "x.jsonl", "--from-log")
    with pytest.raises(CommandError, match="at least 1"):
        call_command("kb_calibrate", "--from-log", "--days", "0")


def test_kb_calibrate_from_log_with_no_traffic_says_so(kb):
    with pytest.raises(CommandError, match="no questions reached the KB in the last 7 day"):
        call_command("kb_calibrate", "--from-log")


def test_the_admin_calibrates_from_traffic_and_a_superuser_applies_it_in_one_logged_click(
    traffic, django_user_model, curator_client
):
    for hit in Hit.objects.all():
        Feedback.objects.create(request_key=hit.key, verdict="up", interface="web")
    page = curator_client.get("/admin/knowledge/calibration/")
    assert "Calibrate from traffic" in page.text
    made = curator_client.post(
        "/admin/knowledge/calibration/from-traffic/", {"days": "7", "target": "0.98"}
    )
    run = Calibration.objects.get()
    assert made.status_code == 302 and made["Location"].endswith(f"/calibration/{run.pk}/change/")
    shown = curator_client.get(made["Location"]).text
    assert "hit rate" in shown and run.threshold is not None
    # A curator may run it, not apply it.
    assert curator_client.post(f"/admin/knowledge/calibration/{run.pk}/apply/").status_code == 403
    bad = curator_client.post(
        "/admin/knowledge/calibration/from-traffic/", {"days": "0", "target": "2"}, follow=True
    )
    assert "Not calibrated" in bad.text and Calibration.objects.count() == 1

    admin = django_user_model.objects.create_superuser("root", password="pw-root-123456")
    applied = client_of(admin).post(f"/admin/knowledge/calibration/{run.pk}/apply/")
    assert applied.status_code == 302
    run.refresh_from_db()
    assert run.applied and run.applied_by == admin and run.applied_at is not None
    model = serving_model_forget() or serving_model()
    assert (model.direct_threshold, model.direct_margin) == (run.threshold, run.margin)
    logged = LogEntry.objects.filter(user=admin).values_list("object_repr", "change_message")
    assert any(model.name in r and f"calibration #{run.pk}" in m for r, m in logged)
    assert f"by {admin.username}" in client_of(admin).get(made["Location"]).text
