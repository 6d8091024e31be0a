import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from knowledge.models import Entry, PhrasingVector
from knowledge.selectors import direct_answer

pytestmark = pytest.mark.django_db

GOOD = [
    {
        "question": "Do you ship to Norway?",
        "answer": "Yes, in 3 to 5 days.",
        "aliases": ["delivery to Norway"],
        "tags": ["shipping"],
    },
    {
        "question": "Refund window",
        "answer": "30 days from delivery.",
        "kind": "rule",
        "tags": "policy,refunds",
    },
]


def _jsonl(tmp_path, rows, name="kb.jsonl"):
    path = tmp_path / name
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return str(path)


def test_import_embeds_synchronously_so_entries_answer_when_it_returns(
    tmp_path, capsys, vector_point
):
    call_command("kb_import", _jsonl(tmp_path, GOOD))
    assert "2 created, 0 updated, 0 unchanged, 0 rejected" in capsys.readouterr().out
    norway = Entry.objects.get(question="Do you ship to Norway?")
    assert norway.aliases == ["delivery to Norway"] and norway.tags == ["shipping"]
    assert Entry.objects.get(question="Refund window").tags == ["policy", "refunds"]
    assert PhrasingVector.objects.filter(phrasing__entry=norway).count() == 2
    result = direct_answer("can you deliver to norway")
    assert result.hit and result.entry == norway


def test_importing_the_same_file_twice_updates_instead_of_duplicating(tmp_path, capsys):
    path = _jsonl(tmp_path, GOOD)
    call_command("kb_import", path)
    call_command("kb_import", path)
    assert "0 created, 0 updated, 2 unchanged" in capsys.readouterr().out
    assert Entry.objects.count() == 2

    changed = [{**GOOD[0], "question": "DO YOU SHIP TO NORWAY", "answer": "Yes, in 2 days."}]
    call_command("kb_import", _jsonl(tmp_path, changed, "v2.jsonl"))
    assert Entry.objects.count() == 2
    assert Entry.objects.get(question="DO YOU SHIP TO NORWAY").answer == "Yes, in 2 days."


def test_an_id_column_updates_that_entry(tmp_path):
    call_command("kb_import", _jsonl(tmp_path, GOOD))
    entry = Entry.objects.get(question="Refund window")
    call_command(
        "kb_import",
        _jsonl(
            tmp_path,
            [{"id": entry.pk, "question": "Refund period", "answer": "14 days.", "kind": "rule"}],
            "v2.jsonl",
        ),
    )
    entry.refresh_from_db()
    assert (entry.question, entry.answer) == ("Refund period", "14 days.")


def test_bad_rows_are_reported_by_line_and_skipped_while_good_rows_import(tmp_path, capsys):
    rows = [
        GOOD[0],
        '{"question": "broken", ',
        {"question": "No answer here?"},
        {"question": "Odd kind?", "answer": "x", "kind": "poem"},
        {"question": "Unknown column?", "answer": "x", "colour": "red"},
        {"id": 999999, "question": "Ghost?", "answer": "x"},
        GOOD[1],
        {**GOOD[0], "answer": "again"},
    ]
    with pytest.raises(CommandError, match="6 row\\(s\\) rejected"):
        call_command("kb_import", _jsonl(tmp_path, rows))
    err = capsys.readouterr().err
    assert "kb.jsonl:2: not valid JSON" in err
    assert "kb.jsonl:3: answer: must not be empty" in err
    assert "kb.jsonl:4: kind: must be one of faq, rule, document; got 'poem'" in err
    assert "kb.jsonl:5: colour: is not a known column" in err
    assert "kb.jsonl:6: no entry has id 999999" in err
    assert "kb.jsonl:8: duplicates line 1" in err
    assert sorted(Entry.objects.values_list("question", flat=True)) == [
        "Do you ship to Norway?",
        "Refund window",
    ]


def test_csv_import_and_export_round_trip(tmp_path):
    source = tmp_path / "kb.csv"
    source.write_text(
        "question,answer,aliases,kind,tags\n"
        '"How do I pay?","By card, or by bank transfer.",payment options|paying,faq,billing\n'
        "如何付款？,银行卡或转账。,怎么付款,faq,billing|zh\n",
        encoding="utf-8",
    )
    call_command("kb_import", str(source))
    entry = Entry.objects.get(question="How do I pay?")
    assert entry.aliases == ["payment options", "paying"]
    assert Entry.objects.get(question="如何付款？").tags == ["billing", "zh"]
    assert direct_answer("怎么付款").entry.answer == "银行卡或转账。"

    exported = tmp_path / "out.csv"
    call_command("kb_export", str(exported))
    Entry.objects.update(answer="overwritten")
    call_command("kb_import", str(exported))
    assert Entry.objects.get(pk=entry.pk).answer == "By card, or by bank transfer."
    assert Entry.objects.count() == 2


def test_export_writes_jsonl_that_import_reads(tmp_path, capsys):
    call_command("kb_import", _jsonl(tmp_path, GOOD))
    capsys.readouterr()
    call_command("kb_export", "-")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["question"] for line in lines} == {"Do you ship to Norway?", "Refund window"}
    assert all(
        set(line) == {"id", "question", "answer", "aliases", "kind", "tags"} for line in lines
    )


def test_an_unreadable_or_unknown_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("kb_import", str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match=r"must end in \.jsonl"):
        call_command("kb_import", str(tmp_path / "kb.xlsx"))


def test_a_row_with_a_nul_or_control_character_is_rejected_by_line_and_the_rest_imports(
    tmp_path, capsys
):
    """A NUL used to fail the whole import at the database (PostgreSQL's text refuses it)."""
    rows = [
        GOOD[0],
        {"question": "Broken\x00question?", "answer": "x"},
        {"question": "Bell?", "answer": "ding\x07"},
        {"question": "Tagged?", "answer": "x", "tags": ["ok", "b\x00d"]},
        GOOD[1],
    ]
    with pytest.raises(CommandError, match="3 row\\(s\\) rejected"):
        call_command("kb_import", _jsonl(tmp_path, rows))
    err = capsys.readouterr().err
    assert "kb.jsonl:2: question: contains a NUL character (U+0000) at character 6" in err
    assert "kb.jsonl:3: answer: contains a control character (U+0007)" in err
    assert "kb.jsonl:4: tags: a tag contains a NUL character (U+0000) at character 1" in err
    assert sorted(Entry.objects.values_list("question", flat=True)) == [
        "Do you ship to Norway?",
        "Refund window",
    ]


def test_another_systems_string_ids_are_kept_and_files_round_trip_between_instances(
    tmp_path, capsys
):
    """Most KB exports carry their own ids; such a row used to be rejected ("id: must be a whole
    number")."""
    rows = [{**GOOD[0], "id": "faq-0001"}, {**GOOD[1], "id": "zendesk:360012"}]
    call_command("kb_import", _jsonl(tmp_path, rows))
    assert "2 created" in capsys.readouterr().out
    assert Entry.objects.get(external_id="faq-0001").question == "Do you ship to Norway?"

    # The same ids again, with an edited question: matched by id, not by question.
    edited = [{**rows[0], "question": "Do you deliver to Norway?"}, rows[1]]
    call_command("kb_import", _jsonl(tmp_path, edited, name="again.jsonl"))
    assert "0 created, 1 updated, 1 unchanged" in capsys.readouterr().out
    assert Entry.objects.get(external_id="faq-0001").question == "Do you deliver to Norway?"

    # This instance's export writes those ids back: another instance imports the file as its own.
    call_command("kb_export", "-")
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["id"] for line in exported) == ["faq-0001", "zendesk:360012"]
    Entry.objects.all().delete()
    call_command("kb_import", _jsonl(tmp_path, exported, name="export.jsonl"))
    assert sorted(Entry.objects.values_list("external_id", flat=True)) == [
        "faq-0001",
        "zendesk:360012",
    ]


def test_an_id_that_is_neither_a_number_nor_text_is_refused_by_line(tmp_path, capsys):
    rows = [{**GOOD[0], "id": [1, 2]}, {**GOOD[1], "id": "x" * 201}]
    with pytest.raises(CommandError, match="2 row\\(s\\) rejected"):
        call_command("kb_import", _jsonl(tmp_path, rows))
    err = capsys.readouterr().err
    assert (
        "kb.jsonl:1: id: must be this instance's whole-number id or another system's text id" in err
    )
    assert "kb.jsonl:2: id: an external id must be up to 200 characters of text" in err


def test_the_csv_export_writes_no_cell_a_spreadsheet_runs_as_a_formula_and_imports_back_unchanged(
    tmp_path, capsys
):
    import csv

    from knowledge.services.entries import entry_create

    formulas = [
        entry_create(
            question='=HYPERLINK("http://evil.example","Help")',
            answer="@SUM(1+1)*cmd|' /C calc'!A0",
            aliases=["+1 555 0100 for help"],
            tags=["=cmd"],
            embed="none",
        ),
        entry_create(
            question="'Tis the season: do you ship for Christmas?",
            answer="- yes\n- until the 20th",
            aliases=["'=not a formula'"],
            embed="none",
        ),
        entry_create(question="Tab?", answer="\tindented", kind="rule", embed="none"),
    ]
    Entry.objects.filter(pk=formulas[2].pk).update(external_id="-ext-1")
    before = {
        e.pk: (e.question, e.answer, e.aliases, e.tags, e.kind, e.external_id)
        for e in Entry.objects.order_by("pk")
    }

    exported = tmp_path / "out.csv"
    call_command("kb_export", str(exported))
    assert "wrote 3 entries" in capsys.readouterr().out  # rows, though an answer spans two lines
    with open(exported, encoding="utf-8", newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert not [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert (
        '\'=HYPERLINK("http://evil.example","Help")' in cells
        and "'- yes\n- until the 20th" in cells
    )

    Entry.objects.update(answer="overwritten")
    call_command("kb_import", str(exported))
    after = {
        e.pk: (e.question, e.answer, e.aliases, e.tags, e.kind, e.external_id)
        for e in Entry.objects.order_by("pk")
    }
    assert after == before
