"""`make lint`'s commit-subject check (devtools/commit_subjects.py)."""

from devtools import commit_subjects


def test_a_subject_of_76_characters_passes_and_one_of_77_is_named():
    subjects = [("a1", "x" * 76), ("b2", "y" * 77)]
    assert commit_subjects.too_long(subjects) == [f"b2: 77 characters: {'y' * 77}"]


def test_a_message_being_written_is_judged_by_its_first_line_that_is_not_a_comment(tmp_path):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("# Please enter the commit message\n\nSettings: a package\n\n" + "z" * 90)
    assert commit_subjects.message_subject(message) == "Settings: a package"
    assert commit_subjects.main(["--message-file", str(message)]) == 0
    message.write_text("w" * 77 + "\n")
    assert commit_subjects.main(["--message-file", str(message)]) == 1
