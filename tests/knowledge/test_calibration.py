"""kb_calibrate: labelled questions through the live matcher, the sweep, the advice, --apply."""

import json

import pytest
from django.core.management import CommandError, call_command

from knowledge.calibration import Point, calibrate, labelled_read, recommend
from knowledge.models import Calibration
from knowledge.selectors import direct_answer, serving_model, serving_model_forget

pytestmark = pytest.mark.django_db


def _labelled(kb):
    return [
        {
            "question": "how do I cancel my order",
            "expected": kb["How do I cancel my order?"].pk,
            "kind": "exact",
        },
        {
            "question": "how can I cancel an order I placed",
            "expected": kb["How do I cancel my order?"].pk,
            "kind": "paraphrase",
        },
        {
            "question": "cancel my subscription plan",
            "expected": kb["How do I cancel my subscription?"].pk,
            "kind": "paraphrase",
        },
        {
            "question": "I forgot my password",
            "expected": kb["How do I reset my password?"].pk,
            "kind": "paraphrase",
        },
        {"question": "explain LoRA", "expected": kb["What is LoRA?"].pk, "kind": "paraphrase"},
        {"question": "怎么取消订单呢", "expected": kb["如何取消订单？"].pk, "kind": "paraphrase"},
        {"question": "How do I cancel my membership?", "expected": None, "kind": "near_miss"},
        {"question": "tell me about LoRA adapters", "expected": None, "kind": "near_miss"},
        {"question": "when are you open on sunday", "expected": None, "kind": "near_miss"},
        {"question": "what is the weather today", "expected": None, "kind": "out_of_domain"},
    ]


def _file(tmp_path, rows):
    path = tmp_path / "labelled.jsonl"
    path.write_text(
        "\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n", encoding="utf-8"
    )
    return path


def test_the_replayed_verdict_is_the_live_verdict_at_every_operating_point(kb, settings):
    items = labelled_read("\n".join(json.dumps(row) for row in _labelled(kb)))
    result = calibrate(items)
    for threshold, margin in [(0.0, 0.0), (0.9, 0.02), (0.95, 0.04), (0.96, 0.06), (0.99, 0.0)]:
        settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN = threshold, margin
        for evidence in result.evidence:
            live = direct_answer(evidence.item.question)
            assert evidence.answer(threshold, margin) == (live.entry.pk if live.hit else None), (
                threshold,
                margin,
                evidence.item.question,
                live.reason,
            )


def test_the_recommendation_is_the_best_recall_at_the_target_precision():
    points = [
        Point(0.9, 0.0, precision=0.90, recall=0.9, answered=10, correct=9),
        Point(0.95, 0.0, precision=1.0, recall=0.6, answered=6, correct=6),
        Point(0.97, 0.0, precision=1.0, recall=0.6, answered=6, correct=6),
        Point(0.99, 0.0, precision=1.0, recall=0.2, answered=2, correct=2),
    ]
    assert recommend(points, 0.98) == points[2]  # the same recall: the stricter point
    assert recommend(points, 0.85) == points[0]
    assert recommend([points[0]], 0.98) is None
    # From traffic, judged in part: among points as good, the one nearest the serving point.
    assert recommend(points, 0.98, near=(0.9, 0.0)) == points[1]
    assert recommend(points, 0.98, near=(0.99, 0.0)) == points[2]


def test_the_command_prints_the_curve_and_recommends_and_applies_a_point(kb, tmp_path, capsys):
    call_command("kb_calibrate", str(_file(tmp_path, _labelled(kb))), "--apply")
    out = capsys.readouterr().out
    assert "10 questions, 6 answerable" in out
    assert "recommended for precision >= 0.98" in out and "applied:" in out
    run = Calibration.objects.get()
    assert (
        run.applied
        and run.precision >= 0.98
        and run.curve
        and run.by_kind["paraphrase"]["asked"] == 5
    )
    serving_model_forget()
    model = serving_model()
    assert (model.direct_threshold, model.direct_margin) == (run.threshold, run.margin)
    # What the run promised is what serving now does.
    answered = [row for row in _labelled(kb) if direct_answer(row["question"]).hit]
    right = [row for row in answered if direct_answer(row["question"]).entry.pk == row["expected"]]
    assert len(right) / len(answered) >= 0.98 and len(right) == round(run.recall * 6)


def test_the_command_names_every_bad_line_and_changes_nothing(kb, tmp_path):
    rows = _labelled(kb)
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps(rows[0]),
                "not json",
                json.dumps({"question": "  "}),
                json.dumps({"question": "x", "expected": "no-such-entry"}),
                json.dumps({"question": "y", "expected": True}),
            ]
        ),
        encoding="utf-8",
    )
    with pytest.raises(CommandError) as caught:
        call_command("kb_calibrate", str(path), "--apply")
    message = str(caught.value)
    for expected in (
        "line 2: not JSON",
        "line 3: needs a non-empty string",
        "line 4: no FAQ entry 'no-such-entry'",
        "line 5: `expected` must be",
    ):
        assert expected in message
    assert not Calibration.objects.exists() and serving_model().direct_threshold is None


def test_external_ids_label_questions_and_a_bad_target_is_refused(kb, tmp_path, capsys):
    entry = kb["What is LoRA?"]
    entry.external_id = "lora"
    entry.save(update_fields=["external_id"])
    path = _file(tmp_path, [{"question": "what is lora", "expected": "lora"}])
    call_command("kb_calibrate", str(path))
    assert "1 questions, 1 answerable" in capsys.readouterr().out
    assert not Calibration.objects.get().applied
    with pytest.raises(CommandError, match="--target"):
        call_command("kb_calibrate", str(path), "--target", "1.5")
    with pytest.raises(CommandError, match="cannot read"):
        call_command("kb_calibrate", str(tmp_path / "missing.jsonl"))
