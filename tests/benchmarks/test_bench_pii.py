"""`manage.py bench_pii`: the detector and the injection screen measured on the shipped labelled
sets, each its generator's output (a change of either without the other fails here)."""

import json

from django.core.management import call_command

from benchmarks import injection_set, pii_set
from privacy.detector import TYPES
from privacy.injection import KINDS


def test_the_shipped_set_is_what_its_generator_builds():
    rows = pii_set.read()
    assert rows == pii_set.build()
    kinds = {f["type"] for row in rows for f in row["findings"]}
    assert kinds == set(TYPES)
    # Each value is in its question, and some questions hold no personal data.
    assert all(f["value"] in row["text"] for row in rows for f in row["findings"])
    assert sum(1 for row in rows if not row["findings"]) >= 50


def test_the_command_reports_each_type_and_the_targets(tmp_path, capsys):
    out = tmp_path / "pii.json"
    call_command("bench_pii", "--repeat", "1", "--json", str(out))
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["questions"] == len(pii_set.read())
    for kind in TYPES:
        row = report["types"][kind]
        assert row["right"] + row["missed"] == sum(
            1 for r in pii_set.read() for f in r["findings"] if f["type"] == kind
        )
        assert f"\n{kind:<12} {row['right']:>6}" in printed
    assert report["cost"]["samples"] == len(pii_set.read())
    for kind in ("bank_card", "cn_id", "iban"):
        assert f"{kind}: recall >= 0.95" in printed
    assert "detector p50 <= 1.0 ms" in printed
    injection = report["injection"]
    rows = injection_set.read()
    assert injection["texts"] == len(rows)
    assert "\nInjection screen: " in printed
    for kind in KINDS:
        row = injection["kinds"][kind]
        assert row["right"] + row["missed"] == sum(1 for r in rows if r["kind"] == kind)
        assert f"\n{kind:<20} {row['right']:>6}" in printed
    assert injection["cost"]["samples"] == len(rows)
    assert injection["cost_plain"]["samples"] == len(pii_set.read())
    assert "injection: precision >= 0.95" in printed
    assert "screen p50 <= 0.05 ms" in printed
    assert report["screening"]["samples"] == len(rows) + len(pii_set.read())
    assert "the hot path's cost, a request's screening" in printed


def test_the_shipped_injection_set_is_what_its_generator_builds():
    rows = injection_set.read()
    assert rows == injection_set.build()
    assert len(rows) >= 150
    assert {row["kind"] for row in rows} == {*KINDS, None}
    assert {row["lang"] for row in rows} == {"en", "zh"}
    # Hard negatives in both languages, not only attacks.
    assert sum(1 for row in rows if row["kind"] is None and row["lang"] == "en") >= 40
    assert sum(1 for row in rows if row["kind"] is None and row["lang"] == "zh") >= 30
