"""`manage.py bench_kb_curation`, small: the days of traffic run through the live matcher, the
curator's accepted groups become phrasings, and what the KB answered directly is right. In a
subprocess, as the command points its database connection at a bench database of its own."""

import re

import pytest

from tests.support.commands import manage

pytestmark = pytest.mark.processes  # its own database, the embedding model loaded


def test_a_short_run_reports_each_day_and_the_curated_groups_raise_the_hit_rate(child_env):
    stdout = manage(child_env, "bench_kb_curation", "--days", "3", "--per-day", "120", timeout=280)
    days = re.findall(
        r"^day (\d): hit rate of answerable traffic ([\d.]+) \((\d+) of (\d+)\), precision "
        r"([\d.]+) \((\d+) wrong\); curator: (\d+) of (\d+) groups accepted, (\d+) questions "
        r"marked wrong reviewed; (\d+) direct answers rated$",
        stdout,
        re.M,
    )
    assert [day[0] for day in days] == ["1", "2", "3"], stdout
    assert all(float(day[4]) >= 0.98 for day in days), stdout
    assert sum(int(day[6]) for day in days) > 0, stdout  # the curator accepted some groups
    assert float(days[-1][1]) > float(days[0][1]), stdout  # and they are answered since
    assert "precision >= 0.98 every day:" in stdout
    assert "hit rate day 3 >= 2x day 1:" in stdout
    assert sum(int(day[9]) for day in days) > 0, stdout  # users rated direct answers
    # Calibration from the run's traffic: the serving point, checked against the labelled set.
    replayed = re.search(r"^from traffic: (\d+) questions replayed, (\d+) judged", stdout, re.M)
    assert replayed and int(replayed[1]) == 3 * 120 and int(replayed[2]) > 0, stdout
    assert re.search(r"^  serving point: threshold [\d.]+, margin [\d.]+: precision ", stdout, re.M)
