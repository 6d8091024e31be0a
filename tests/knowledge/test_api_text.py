"""KB entries through the API refuse text that cannot be stored, with a 400 in the API's error
shape."""

import json

import pytest

from knowledge.models import Entry

pytestmark = pytest.mark.django_db


GOOD = {
    "question": "Do you ship to Chile?",
    "answer": "Yes.",
    "aliases": ["delivery to Chile"],
    "tags": ["shipping"],
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("question", "Do you ship\x00 to Chile?"),
        ("question", "Do you ship \ud83d to Chile?"),
        ("answer", "Yes\x1b[2J."),
        ("aliases", ["delivery\x00 to Chile"]),
        ("aliases", ["delivery \udc00"]),
        ("tags", ["ship\ud800"]),
    ],
)
def test_an_entry_with_text_that_cannot_be_stored_is_a_400_and_nothing_is_written(
    staff, field, value
):
    # ASCII JSON, as a client sends a lone surrogate: the escape "\ud83d".
    response = staff.generic(
        "POST",
        "/api/kb/entries/",
        json.dumps({**GOOD, field: value}),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (
        error["code"] == "invalid"
        and field in error["message"]
        and next(iter(error["fields"])).startswith(field)
    )
    assert not Entry.objects.exists()


def test_an_edit_with_text_that_cannot_be_stored_is_a_400_and_the_entry_is_unchanged(staff):
    entry_id = staff.post("/api/kb/entries/", GOOD, format="json").json()["id"]
    response = staff.generic(
        "PATCH",
        f"/api/kb/entries/{entry_id}/",
        json.dumps({"answer": "Yes \ud800"}),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert Entry.objects.get(pk=entry_id).answer == "Yes."


@pytest.mark.parametrize("path", ["/api/kb/search", "/api/kb/answer"])
@pytest.mark.parametrize("q", ["ship\x00", "ship \x1b[31m"])
def test_a_search_for_text_that_cannot_be_searched_is_a_400(staff, path, q):
    response = staff.get(path, {"q": q})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"]["q"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"kind": "F\x00x"}, "kind"),
        ({"kind": "poem"}, "kind"),
        ({"tag": "a\x00b"}, "tag"),
        ({"tag": "x" * 65}, "tag"),
        ({"active": "maybe"}, "active"),
    ],
)
def test_the_entry_list_refuses_a_bad_filter_with_a_400_that_names_it(staff, params, field):
    response = staff.get("/api/kb/entries/", params)
    assert response.status_code == 400
    assert field in json.dumps(response.json())


def test_the_entry_list_filters_by_kind_active_and_tag(staff):
    staff.post("/api/kb/entries/", {**GOOD, "tags": ["shipping"]}, format="json")
    assert [
        e["question"]
        for e in staff.get(
            "/api/kb/entries/", {"kind": "faq", "active": "true", "tag": "Shipping"}
        ).json()["results"]
    ] == [GOOD["question"]]
    assert staff.get("/api/kb/entries/", {"active": "false"}).json()["results"] == []
    assert staff.get("/api/kb/entries/", {"kind": "rule"}).json()["results"] == []
