import pytest
from django.utils import timezone

from knowledge.embedding import embed_query, spec_of
from knowledge.misses import miss_flush, miss_note
from knowledge.models import Entry, Miss, PhrasingVector
from knowledge.selectors import direct_answer, serving_model
from knowledge.services.entries import entry_create
from tests.support.personas import NO_DELETE, VIEW_ONLY, client_of, shown_messages, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, admin_user):
    client.force_login(admin_user)
    return client


def test_the_try_tool_shows_matches_scores_margin_and_verdict(staff_client, kb, vector_point):
    response = staff_client.get(
        "/admin/knowledge/entry/try/", {"q": "how can I cancel an order I placed"}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert "Answered directly (vector)" in html
    assert "Margin over the runner-up" in html
    assert f"KB#{kb['How do I cancel my order?'].pk}" in html
    assert f"KB#{kb['How do I cancel my subscription?'].pk}" in html  # the runner-up is listed too

    html = staff_client.get(
        "/admin/knowledge/entry/try/", {"q": "How do I cancel my membership?"}
    ).content.decode()
    assert "Not answered directly" in html and "too close" in html


def test_adding_an_entry_in_the_admin_goes_through_the_service(
    staff_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = staff_client.post(
            "/admin/knowledge/entry/add/",
            {
                "kind": "faq",
                "question": "Is there a student discount?",
                "aliases": "student price\nstudents",
                "answer": "Yes, 20%.",
                "tags": "pricing, students",
                "active": "on",
                "threshold": "",
            },
        )
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = Entry.objects.get(question="Is there a student discount?")
    assert entry.aliases == ["student price", "students"] and entry.tags == ["pricing", "students"]
    assert entry.phrasings.count() == 3
    assert len(callbacks) == 1  # the embedding task is enqueued after commit


def test_the_admin_rejects_an_empty_answer_with_a_message(staff_client):
    response = staff_client.post(
        "/admin/knowledge/entry/add/",
        {
            "kind": "faq",
            "question": "Anything?",
            "answer": "   ",
            "aliases": "",
            "tags": "",
            "threshold": "",
        },
    )
    assert response.status_code == 200
    assert (
        "This field is required." in response.content.decode()
        or "must not be empty" in response.content.decode()
    )
    assert not Entry.objects.exists()


def test_bulk_deactivate_and_activate(staff_client, kb):
    ids = [kb["What is LoRA?"].pk, kb["What is QLoRA?"].pk]
    staff_client.post("/admin/knowledge/entry/", {"action": "deactivate", "_selected_action": ids})
    assert not Entry.objects.filter(pk__in=ids, active=True).exists()
    staff_client.post("/admin/knowledge/entry/", {"action": "activate", "_selected_action": ids})
    assert Entry.objects.filter(pk__in=ids, active=True).count() == 2


def test_the_changelist_searches_aliases_and_filters_by_tag(staff_client, kb):
    html = staff_client.get("/admin/knowledge/entry/", {"q": "forgot password"}).content.decode()
    assert "How do I reset my password?" in html and "What is LoRA?" not in html
    assert staff_client.get("/admin/knowledge/entry/", {"embedded": "no"}).status_code == 200


def test_the_import_form_reports_bad_lines(staff_client, tmp_path):
    upload = tmp_path / "kb.jsonl"
    upload.write_text(
        '{"question": "Q1?", "answer": "A1."}\n{"question": "Q2?"}\n', encoding="utf-8"
    )
    with open(upload, "rb") as handle:
        response = staff_client.post(
            "/admin/knowledge/entry/import/", {"file": handle, "embed": "sync"}
        )
    html = response.content.decode()
    assert "1 created, 0 updated, 0 unchanged, 1 rejected" in html
    assert "answer: must not be empty" in html
    entry = Entry.objects.get(question="Q1?")
    assert PhrasingVector.objects.filter(phrasing__entry=entry).exists()


def test_misses_are_grouped_and_one_action_turns_one_into_an_entry(staff_client, kb, settings):
    # As the pipeline does: each question embedded once by the serving model, noted after the
    # answer.
    settings.KB_RECORD_MISSES, settings.KB_MISS_FLUSH_SECONDS = (
        True,
        3600,
    )  # written below, in this test
    model = serving_model()
    for question, answer in [
        ("Do you have gift cards?", "Yes, from 10 to 200 euros."),
        ("do you have gift cards", "Yes."),
        ("Can I buy a gift card?", "Yes."),
        ("What is your phone number?", "+1 555 0100"),
    ]:
        miss_note(
            question=question,
            answer=answer,
            best_entry_id=None,
            best_score=None,
            model_id=model.pk,
            vector=embed_query(spec_of(model), question),
        )
    miss_flush()
    assert not Miss.objects.filter(
        grouped_at__isnull=False
    ).exists()  # grouping waits for a curator or beat

    html = staff_client.get("/admin/knowledge/miss/").content.decode()
    first = Miss.objects.get(question="Do you have gift cards?")
    assert first.count == 3 and first.group is None
    assert html.index("Do you have gift cards?") < html.index("What is your phone number?")
    assert "Can I buy a gift card?" not in html  # a member shows through its group's count
    assert "2 KB misses" in html

    response = staff_client.post(
        "/admin/knowledge/miss/", {"action": "make_entry", "_selected_action": [first.pk]}
    )
    entry = Entry.objects.get(question="Do you have gift cards?")
    assert response.status_code == 302 and response["Location"].endswith(
        f"/entry/{entry.pk}/change/"
    )
    assert entry.answer == "Yes, from 10 to 200 euros."
    assert Miss.objects.filter(resolved_by=entry).count() == 3


def test_one_action_adds_a_groups_questions_to_its_closest_entry_and_the_kb_answers_them(
    staff_client, kb
):
    password = kb["How do I reset my password?"]
    head = Miss.objects.create(
        question="I can't log in, lost my password",
        normalized="i cant log in lost my password",
        answer="Try the reset link.",
        best_entry=password,
        best_score=0.91,
        reason="KB#3 scored 0.910, below the threshold 0.940",
        count=3,
        grouped_at=timezone.now(),
    )
    for question in ("lost my password, can't log in", "forgot password"):  # the second it has
        Miss.objects.create(
            question=question, normalized=question, group=head, grouped_at=timezone.now()
        )
    assert not direct_answer("lost my password, can't log in").hit
    listed = staff_client.get("/admin/knowledge/miss/").content.decode()
    assert "below the threshold 0.940" in listed  # why the KB did not answer, beside its pick

    response = staff_client.post(
        "/admin/knowledge/miss/",
        {"action": "add_as_phrasings", "_selected_action": [head.pk]},
        follow=True,
    )
    assert "2 question(s) added as phrasings of 1 entry" in response.content.decode()
    password.refresh_from_db()
    assert password.aliases == [
        "forgot password",
        "I can't log in, lost my password",
        "lost my password, can't log in",
    ]
    assert Miss.objects.filter(resolved_by=password).count() == 3
    for question in ("lost my password, can't log in", "I CAN'T LOG IN, LOST MY PASSWORD"):
        verdict = direct_answer(question)
        assert verdict.hit and verdict.entry.pk == password.pk
    # The entry's own wordings kept their vectors: nothing of it waits for the new embeddings.
    assert PhrasingVector.objects.filter(phrasing__entry=password).count() == 2


def test_a_curator_may_add_a_groups_questions_to_another_entry_than_the_closest(staff_client, kb):
    closest, picked = kb["How do I reset my password?"], kb["How do I cancel my order?"]
    head = Miss.objects.create(
        question="undo my purchase",
        normalized="undo my purchase",
        best_entry=closest,
        best_score=0.87,
        grouped_at=timezone.now(),
    )
    page = staff_client.post(
        "/admin/knowledge/miss/", {"action": "add_to_entry", "_selected_action": [head.pk]}
    ).content.decode()
    assert "undo my purchase" in page and f'value="{closest.pk}"' in page  # the closest, offered
    wrong = staff_client.post(
        "/admin/knowledge/miss/",
        {"action": "add_to_entry", "_selected_action": [head.pk], "apply": "1", "entry": "999999"},
    )
    assert "No FAQ entry has that number." in wrong.content.decode()
    assert not Miss.objects.filter(resolved_by__isnull=False).exists()

    done = staff_client.post(
        "/admin/knowledge/miss/",
        {"action": "add_to_entry", "_selected_action": [head.pk], "apply": "1", "entry": picked.pk},
        follow=True,
    )
    assert f"1 question(s) added as phrasings of KB#{picked.pk}" in done.content.decode()
    assert direct_answer("Undo my purchase!").entry.pk == picked.pk
    head.refresh_from_db()
    assert head.resolved_by_id == picked.pk


def test_a_dismissed_group_leaves_the_list_and_its_filter_shows_it(staff_client):
    asked = {
        question: Miss.objects.create(
            question=question, normalized=question, count=count, grouped_at=timezone.now()
        )
        for question, count in (("what is the weather in paris", 9), ("do you sell bikes", 2))
    }
    staff_client.post(
        "/admin/knowledge/miss/",
        {"action": "dismiss", "_selected_action": [asked["what is the weather in paris"].pk]},
    )
    listed = staff_client.get("/admin/knowledge/miss/").content.decode()
    assert "do you sell bikes" in listed and "what is the weather in paris" not in listed
    dismissed = staff_client.get("/admin/knowledge/miss/", {"dismissed_at__isempty": "0"})
    assert "what is the weather in paris" in dismissed.content.decode()
    assert "do you sell bikes" not in dismissed.content.decode()


def test_non_staff_users_cannot_reach_the_curation_tools(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("user", password="pw-123456789"))
    assert client.get("/admin/knowledge/entry/try/", {"q": "x"}).status_code == 302


# --- who may use the curation tools: Django's model permissions, action by action ----------------


def _grouped_miss(question="Do you sell gift cards?", answer="Yes, from 10 to 200 euros.") -> Miss:
    return Miss.objects.create(
        question=question,
        normalized=question.lower(),
        answer=answer,
        count=3,
        grouped_at=timezone.now(),
    )


def test_a_view_only_curator_cannot_activate_deactivate_or_reembed_entries():
    live = entry_create(question="What is LoRA?", answer="Low-rank adaptation.", embed="none")
    idle = entry_create(
        question="What is QLoRA?", answer="LoRA on a 4-bit base.", active=False, embed="none"
    )
    viewer = client_of(staff_user("viewer", verbs=VIEW_ONLY))
    page = viewer.get("/admin/knowledge/entry/").content.decode()
    assert (
        "What is LoRA?" in page
        and "Deactivate selected entries" not in page
        and "Re-embed" not in page
    )
    for action in ("activate", "deactivate", "reembed_selected", "reembed_everything"):
        # As if the form still offered it: the list again, and no word of it having run.
        response = viewer.post(
            "/admin/knowledge/entry/", {"action": action, "_selected_action": [live.pk, idle.pk]}
        )
        assert response.status_code == 200 and shown_messages(response) == [], action
    assert Entry.objects.get(pk=live.pk).active and not Entry.objects.get(pk=idle.pk).active


def test_a_curator_who_may_change_entries_deactivates_them():
    entry = entry_create(question="What is LoRA?", answer="Low-rank adaptation.", embed="none")
    curator = client_of(staff_user("editor", verbs=NO_DELETE))
    response = curator.post(
        "/admin/knowledge/entry/", {"action": "deactivate", "_selected_action": [entry.pk]}
    )
    assert shown_messages(response) == ["1 entries deactivated."]
    assert not Entry.objects.get(pk=entry.pk).active


def test_a_view_only_curator_cannot_turn_a_miss_into_an_entry():
    miss = _grouped_miss()
    viewer = client_of(staff_user("viewer", verbs=VIEW_ONLY))
    assert (
        "Turn the generated answer into a KB entry"
        not in viewer.get("/admin/knowledge/miss/").content.decode()
    )
    response = viewer.post(
        "/admin/knowledge/miss/", {"action": "make_entry", "_selected_action": [miss.pk]}
    )
    assert response.status_code == 200 and shown_messages(response) == []
    assert not Entry.objects.exists() and Miss.objects.get(pk=miss.pk).resolved_by is None


def test_turning_a_miss_into_an_entry_needs_the_permission_to_add_entries():
    miss = _grouped_miss()
    triager = client_of(
        staff_user(
            "triager",
            perms=(
                "knowledge.view_miss",
                "knowledge.change_miss",
                "knowledge.view_entry",
                "knowledge.change_entry",
            ),
        )
    )
    assert (
        "Turn the generated answer into a KB entry"
        not in triager.get("/admin/knowledge/miss/").content.decode()
    )
    response = triager.post(
        "/admin/knowledge/miss/",
        {"action": "make_entry", "_selected_action": [miss.pk]},
        follow=True,
    )
    # Offered another action (adding phrasings: they may change entries), not this one.
    assert shown_messages(response) == ["No action selected."]
    assert not Entry.objects.exists()

    curator = client_of(staff_user("editor", verbs=NO_DELETE))
    response = curator.post(
        "/admin/knowledge/miss/", {"action": "make_entry", "_selected_action": [miss.pk]}
    )
    entry = Entry.objects.get(question="Do you sell gift cards?")
    assert response.status_code == 302 and response["Location"].endswith(
        f"/entry/{entry.pk}/change/"
    )


def test_staff_without_permissions_cannot_import_entries(tmp_path):
    upload = tmp_path / "kb.csv"
    upload.write_text(
        "question,answer\nWhat is the refund policy?,Refunds are wired to this account.\n",
        encoding="utf-8",
    )
    bare = client_of(staff_user("bare"))
    assert bare.get("/admin/knowledge/entry/import/").status_code == 403
    with open(upload, "rb") as handle:
        assert (
            bare.post(
                "/admin/knowledge/entry/import/", {"file": handle, "embed": "async"}
            ).status_code
            == 403
        )
    assert not Entry.objects.exists()


def test_importing_needs_the_permission_to_change_entries_as_well_as_to_add_them(tmp_path):
    # An import updates the entry that already has a row's question: it is an edit as well.
    entry_create(
        question="What is the refund policy?", answer="Refunds within 30 days.", embed="none"
    )
    upload = tmp_path / "kb.csv"
    upload.write_text(
        "question,answer\nWhat is the refund policy?,Refunds are wired to this account.\n",
        encoding="utf-8",
    )
    adder = client_of(staff_user("adder", perms=("knowledge.view_entry", "knowledge.add_entry")))
    with open(upload, "rb") as handle:
        assert (
            adder.post(
                "/admin/knowledge/entry/import/", {"file": handle, "embed": "async"}
            ).status_code
            == 403
        )
    assert Entry.objects.get().answer == "Refunds within 30 days."
    page = adder.get("/admin/knowledge/entry/").content.decode()
    assert "/admin/knowledge/entry/try/" in page


def test_trying_a_question_needs_the_permission_to_view_entries():
    entry_create(
        question="What is the refund policy?", answer="Refunds within 30 days.", embed="none"
    )
    assert (
        client_of(staff_user("bare"))
        .get("/admin/knowledge/entry/try/", {"q": "refund"})
        .status_code
        == 403
    )
    viewer = client_of(staff_user("viewer", perms=("knowledge.view_entry",)))
    assert (
        viewer.get("/admin/knowledge/entry/try/", {"q": "What is the refund policy?"}).status_code
        == 200
    )


IMPORT_LINK = 'href="/admin/knowledge/entry/import/"'
TRY_LINK = 'href="/admin/knowledge/entry/try/"'


def test_a_view_only_curator_is_not_offered_the_import_they_may_not_run():
    entry_create(question="What is LoRA?", answer="Low-rank adaptation.", embed="none")
    page = (
        client_of(staff_user("viewer", verbs=VIEW_ONLY))
        .get("/admin/knowledge/entry/")
        .content.decode()
    )
    assert "What is LoRA?" in page and TRY_LINK in page  # trying a question only reads entries
    assert IMPORT_LINK not in page
    adder = client_of(staff_user("adder", perms=("knowledge.view_entry", "knowledge.add_entry")))
    assert (
        IMPORT_LINK not in adder.get("/admin/knowledge/entry/").content.decode()
    )  # an import edits too


def test_a_curator_is_offered_the_import_and_the_try_tool():
    page = (
        client_of(staff_user("editor", verbs=NO_DELETE))
        .get("/admin/knowledge/entry/")
        .content.decode()
    )
    assert IMPORT_LINK in page and TRY_LINK in page
