"""The calibration runs in the admin: the curve drawn as SVG, the wrong answers listed, and the
recommended operating point applied to its model by a superuser only."""

import xml.etree.ElementTree as ET

import pytest

from knowledge.charts import calibration_chart
from knowledge.models import Calibration, EmbeddingModel
from knowledge.selectors import serving_model
from knowledge.services.vectors import embedding_model_ensure
from tests.config.test_security_headers import InlineCode
from tests.support.personas import client_of

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"
CURVE = [
    [round(0.70 + 0.01 * i, 3), 0.01, round(0.80 + 0.01 * i, 4), round(0.95 - 0.03 * i, 4)]
    for i in range(20)
]


@pytest.fixture
def model():
    """The configured model's row, serving, as on a fresh deployment."""
    return embedding_model_ensure()


@pytest.fixture
def superuser_client(admin_user):
    return client_of(admin_user)


def _run(model, **fields):
    defaults = dict(
        model=model,
        source="labelled.jsonl",
        target=0.98,
        questions=40,
        answerable=30,
        threshold=0.85,
        margin=0.01,
        precision=0.95,
        recall=0.5,
        curve=CURVE,
        wrong=[
            {
                "line": 7,
                "question": "Can I <b>cancel</b> my plan?",
                "kind": "near_miss",
                "expected": None,
                "expected_question": "",
                "got": 12,
                "got_question": "How do I cancel my order?",
                "score": 0.861,
                "lead": 0.0123,
                "guard": "",
            }
        ],
        by_kind={
            "paraphrase": {
                "asked": 30,
                "answerable": 30,
                "answered": 16,
                "correct": 15,
                "wrong": 1,
            },
            "out_of_domain": {"asked": 10, "answerable": 0},
        },
    )
    return Calibration.objects.create(**(defaults | fields))


def _change_url(run):
    return f"/admin/knowledge/calibration/{run.pk}/change/"


def _apply_url(run):
    return f"/admin/knowledge/calibration/{run.pk}/apply/"


def test_the_change_page_draws_the_curve_marks_both_points_and_lists_the_wrong_answers(
    superuser_client, model
):
    run = _run(model)
    response = superuser_client.get(_change_url(run))
    html = response.content.decode()
    assert response.status_code == 200
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg"')
    svg = html[start : html.index("</svg>", start) + len("</svg>")]
    chart = ET.fromstring(svg)
    lines = {line.get("class"): line for line in chart.iter(f"{SVG}polyline")}
    assert set(lines) == {"precision", "recall"}
    assert all(len(line.get("points").split()) == len(CURVE) for line in lines.values())
    assert chart.find(f"{SVG}line[@class='recommended']") is not None
    assert (
        chart.find(f"{SVG}line[@class='current']") is not None
    )  # the model serves at its default, not 0.85
    assert "recommended 0.850 / 0.010" in svg
    assert f"current {model.threshold:.3f} / {model.margin:.3f}" in svg
    assert "threshold 0.850" in html and "recall 0.500" in html

    by_kind = html[html.index('id="by-kind"') :]
    assert "<td>paraphrase</td><td>30</td><td>30</td><td>16</td>" in by_kind
    assert (
        "<td>out_of_domain</td><td>10</td><td>0</td><td>0</td>" in by_kind
    )  # counts it never had are 0
    wrong = html[html.index('id="wrong"') :]
    assert "Can I &lt;b&gt;cancel&lt;/b&gt; my plan?" in wrong and "<b>cancel" not in wrong
    assert 'href="/admin/knowledge/entry/12/change/">KB#12</a> How do I cancel my order?' in wrong
    assert "none (no answer expected)" in wrong and "0.861" in wrong and "0.012" in wrong
    assert "Apply this operating point to" in html


def test_the_change_page_holds_nothing_the_content_security_policy_refuses(superuser_client, model):
    response = superuser_client.get(_change_url(_run(model)))
    parser = InlineCode()
    parser.feed(response.content.decode())
    assert parser.found == []
    assert "style-src 'self'" in response["Content-Security-Policy"]
    assert "/static/knowledge/calibration.css" in response.content.decode()


def test_the_models_point_is_not_marked_twice_when_it_already_is_the_runs(superuser_client, model):
    run = _run(model, threshold=model.threshold, margin=model.margin)
    html = superuser_client.get(_change_url(run)).content.decode()
    assert 'class="recommended"' in html and 'class="current"' not in html
    assert "this run&#x27;s point" in html or "this run's point" in html


def test_users_without_staff_are_refused_the_runs_and_the_apply(user_client, client, model):
    run = _run(model)
    for anyone in (user_client, client):
        assert anyone.get("/admin/knowledge/calibration/").status_code == 302
        assert anyone.get(_change_url(run)).status_code == 302
        assert anyone.post(_apply_url(run)).status_code == 302
    model.refresh_from_db()
    assert model.direct_threshold is None


def test_a_superuser_applies_the_runs_point_from_its_page_and_serving_uses_it_at_once(
    superuser_client, model
):
    run = _run(model)
    assert serving_model().threshold != 0.85  # cached by this process before the change
    response = superuser_client.post(_apply_url(run), follow=True)
    assert response.redirect_chain == [(_change_url(run), 302)]
    assert "now answers directly at threshold 0.850, margin 0.010" in response.content.decode()
    model.refresh_from_db()
    run.refresh_from_db()
    assert (model.direct_threshold, model.direct_margin) == (0.85, 0.01) and run.applied
    assert (serving_model().threshold, serving_model().margin) == (0.85, 0.01)


def test_a_superuser_applies_a_run_with_the_changelist_action(superuser_client, model):
    run = _run(model, threshold=0.9, margin=0.02)
    assert 'value="apply"' in superuser_client.get("/admin/knowledge/calibration/").content.decode()
    response = superuser_client.post(
        "/admin/knowledge/calibration/",
        {"action": "apply", "_selected_action": [run.pk]},
        follow=True,
    )
    assert response.status_code == 200
    model.refresh_from_db()
    assert (model.direct_threshold, model.direct_margin) == (0.9, 0.02)
    assert Calibration.objects.get(pk=run.pk).applied


def test_two_runs_of_one_model_are_not_applied_together(superuser_client, model):
    runs = [_run(model, threshold=0.9), _run(model, threshold=0.8)]
    response = superuser_client.post(
        "/admin/knowledge/calibration/",
        {"action": "apply", "_selected_action": [r.pk for r in runs]},
        follow=True,
    )
    assert "Select one calibration per model" in response.content.decode()
    model.refresh_from_db()
    assert model.direct_threshold is None and not Calibration.objects.filter(applied=True).exists()


def test_staff_who_are_not_superusers_read_the_run_but_cannot_apply_or_delete_it(
    curator_client, model
):
    run = _run(model)
    page = curator_client.get(_change_url(run))
    assert page.status_code == 200 and "<svg" in page.content.decode()
    assert "Apply this operating point" not in page.content.decode()
    changelist = curator_client.get("/admin/knowledge/calibration/").content.decode()
    assert 'value="apply"' not in changelist and 'value="delete_selected"' not in changelist

    curator_client.post(
        "/admin/knowledge/calibration/", {"action": "apply", "_selected_action": [run.pk]}
    )
    assert curator_client.post(_apply_url(run)).status_code == 403
    assert (
        curator_client.post(
            f"/admin/knowledge/calibration/{run.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    model.refresh_from_db()
    assert model.direct_threshold is None and not Calibration.objects.get(pk=run.pk).applied


def test_a_run_without_a_recommended_point_cannot_be_applied(superuser_client, model):
    run = _run(model, threshold=None, margin=None, precision=None, recall=None, wrong=[])
    html = superuser_client.get(_change_url(run)).content.decode()
    assert (
        "No operating point reaches precision 0.98" in html
        and "Apply this operating point" not in html
    )
    assert (
        'class="recommended"' not in html and 'class="current"' in html
    )  # the model's own point still shows

    response = superuser_client.post(_apply_url(run), follow=True)
    assert (
        "reached no operating point at precision 0.98: there is nothing to apply"
        in response.content.decode()
    )
    response = superuser_client.post(
        "/admin/knowledge/calibration/",
        {"action": "apply", "_selected_action": [run.pk]},
        follow=True,
    )
    assert "there is nothing to apply" in response.content.decode()
    model.refresh_from_db()
    assert model.direct_threshold is None and not Calibration.objects.get(pk=run.pk).applied


def test_runs_come_from_the_command_only_and_a_superuser_may_delete_one(superuser_client, model):
    run = _run(model)
    assert superuser_client.get("/admin/knowledge/calibration/add/").status_code == 403
    assert superuser_client.post(_change_url(run), {"threshold": "0.1"}).status_code == 403
    assert superuser_client.get(_apply_url(run)).status_code == 405
    assert (
        superuser_client.post(
            f"/admin/knowledge/calibration/{run.pk}/delete/", {"post": "yes"}
        ).status_code
        == 302
    )
    assert not Calibration.objects.filter(pk=run.pk).exists()


def test_the_changelist_lists_runs_and_filters_by_model(superuser_client, model):
    other = EmbeddingModel.objects.create(name="other-model", backend="local", dimensions=4)
    _run(model, threshold=0.855)
    _run(other, threshold=0.905)
    html = superuser_client.get("/admin/knowledge/calibration/").content.decode()
    assert "0.855" in html and "0.905" in html
    html = superuser_client.get(
        "/admin/knowledge/calibration/", {"model__id__exact": other.pk}
    ).content.decode()
    assert "0.905" in html and "0.855" not in html


def test_the_embedding_model_list_shows_the_effective_point_and_links_the_latest_run(
    superuser_client, model
):
    _run(model)
    latest = _run(model)
    html = superuser_client.get("/admin/knowledge/embeddingmodel/").content.decode()
    assert f"{model.threshold:.3f} / {model.margin:.3f} (default)" in html
    assert (
        f'href="/admin/knowledge/calibration/{latest.pk}/change/">calibration #{latest.pk}</a>'
        in html
    )

    EmbeddingModel.objects.filter(pk=model.pk).update(direct_threshold=0.875, direct_margin=0.015)
    html = superuser_client.get("/admin/knowledge/embeddingmodel/").content.decode()
    assert "0.875 / 0.015 (own)" in html
    assert (
        "0.875 / 0.015 (own)"
        in superuser_client.get(
            f"/admin/knowledge/embeddingmodel/{model.pk}/change/"
        ).content.decode()
    )


def test_the_chart_escapes_its_text():
    svg = calibration_chart(CURVE, label='<script>alert("x")</script> & more')
    assert "<script>" not in svg
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in svg
    ET.fromstring(svg)  # well-formed


def test_the_chart_of_an_empty_curve_says_so_and_still_draws_its_axes():
    chart = ET.fromstring(calibration_chart([], target=0.98))
    assert chart.get("viewBox") == "0 0 480 320"
    assert not list(chart.iter(f"{SVG}polyline"))
    texts = [text.text for text in chart.iter(f"{SVG}text")]
    assert "No points to draw" in texts and "threshold" in texts and "1.0" in texts


def test_the_chart_spans_the_marked_points_outside_the_curve():
    chart = ET.fromstring(calibration_chart(CURVE, current=(0.3, 0.05)))
    ticks = [
        float(text.text)
        for text in chart.iter(f"{SVG}text")
        if text.get("text-anchor") == "middle" and text.text.replace(".", "").isdigit()
    ]
    assert min(ticks) <= 0.3 and max(ticks) >= CURVE[-1][0]
    current = chart.find(f"{SVG}line[@class='current']")
    assert 40 <= float(current.get("x1")) <= 480 - 20  # inside the plot
