"""`manage.py bench_prefix` end to end on the simulator (whose prefix cache keeps vLLM's books):
its own engine, gateway and database, cache on then off, and what its user reads. The figures
on the real vLLM are in docs/benchmarks.md; here they must be there, and the books must add up."""

import re

import pytest

from tests.support.commands import manage


@pytest.mark.processes
def test_conversations_hit_the_prefix_cache_when_it_is_on_and_not_when_it_is_off(
    test_database_url, child_env
):
    printed = manage(
        child_env,
        "bench_prefix",
        "--engine",
        "simulator",
        "--conversations",
        "2",
        "--turns",
        "3",
        "--max-tokens",
        "8",
        timeout=280,
    )
    runs = re.findall(
        r"2 conversations x 3 turns, (\d+) failed, \d+ empty: TTFT p50 turn 1 (\d+) ms, "
        r"turns 2\+ (\d+) ms; "
        r"prefix cache hits ([\d.]+|-) \((\d+) of (\d+) prompt tokens\)",
        printed,
    )
    assert len(runs) == 2, printed
    (failed_on, _, _, ratio_on, hits_on, queries_on), (failed_off, *_, hits_off, _) = runs
    assert failed_on == failed_off == "0"
    # On: the long system prompt and each conversation's earlier turns come from the cache.
    assert float(ratio_on) > 0.5 and int(hits_on) > 0 and int(queries_on) > int(hits_on)
    assert int(hits_off) == 0
    assert re.search(r"turn 2\+ TTFT p50: \d+ ms without the cache, \d+ ms with it", printed)


@pytest.mark.processes
def test_on_the_default_rule_stored_sessions_reuse_more_than_plain_history(
    test_database_url, child_env
):
    printed = manage(
        child_env,
        "bench_prefix",
        "--engine",
        "simulator",
        "--rule",
        "default",
        "--conversations",
        "2",
        "--turns",
        "3",
        "--max-tokens",
        "8",
        timeout=280,
    )
    assert re.search(r"(\d+) of \1 questions get KB passages", printed), printed
    runs = dict(
        re.findall(
            r"  (.+?): 2 conversations x 3 turns, 0 failed, \d+ empty: .*? "
            r"prefix cache hits ([\d.]+) \(",
            printed,
        )
    )
    for system in ("short", "long"):
        plain = float(runs[f"{system} system prompt, /v1, plain history"])
        replayed = float(runs[f"{system} system prompt, stored sessions"])
        # Each stored question goes again with its passages: the next turn finds the last one.
        assert replayed > plain, printed
    assert set(runs) >= {
        f"layout {layout}, short system prompt"
        for layout in ("before the question", "after the question", "replayed")
    }, printed


@pytest.mark.processes
def test_the_throughput_mode_loads_the_engine_alone_with_prompts_the_cache_cannot_help(
    test_database_url, child_env
):
    printed = manage(
        child_env,
        "bench_prefix",
        "--throughput",
        "--engine",
        "simulator",
        "--block-size",
        "32",
        "--requests",
        "12",
        "--concurrency",
        "4",
        "--rounds",
        "2",
        "--max-tokens",
        "8",
        timeout=280,
    )
    rounds = re.findall(
        r"round \d: 12 answered, 0 failed in [\d.]+ s: \d+ tokens/s \((\d+) prompt \+ (\d+) "
        r"answer\), [\d.]+ answer tokens/s; prefix cache hits ([\d.]+)",
        printed,
    )
    assert len(rounds) == 2, printed
    for prompt, answer, hits in rounds:
        # Every answer runs to its ceiling, and no prompt finds another's blocks.
        assert int(answer) == 12 * 8 and int(prompt) > 12 * 32
        assert float(hits) == 0
    assert re.search(
        r"throughput, block 32, 4 at once, median of 2: \d+ tokens/s, [\d.]+ answer tokens/s",
        printed,
    ), printed
