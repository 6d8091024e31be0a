"""The gateway's token estimate (`routing.prompt.approx_tokens`) against a real tokenizer:
Gemma 3's, the local engines' (built offline from the bundled GGUF). The estimate must never be
under the real count, whatever the text: it is what a request reserves against its limits before
the engine counts, and what the prompt is cut to fit the window by. Once, at three characters
a token, 1,200 digits were estimated at 400 tokens and counted 1,200 (a digit is a token), emoji
and some scripts at a third or a quarter of their count, and six such requests passed a limit
together by a multiple. And it must not price English prose far above its count: a limit would
admit a fraction of what it allows, and a conversation's history would be cut early.
"""

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from routing.prompt import approx_tokens
from tests.support.gemma_tokenizer import gemma_tokenizer

DATA = Path(__file__).resolve().parents[2] / "routing" / "data"


@pytest.fixture(scope="module")
def gemma():
    return gemma_tokenizer()


def counted(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def chars(low: int, high: int):
    return st.characters(min_codepoint=low, max_codepoint=high, exclude_categories=("Cs",))


# Runs of one script each, joined: every script beside every other, as a multilingual prompt mixes
# them, and runs of anything at all.
SCRIPTS = [
    st.sampled_from(string.ascii_lowercase),
    st.sampled_from(string.ascii_letters),
    st.sampled_from(string.ascii_letters + " "),
    st.sampled_from(string.digits),
    st.sampled_from(string.punctuation),
    st.sampled_from(string.printable),
    st.sampled_from(" \n\t"),
    chars(0xA0, 0x24F),  # Latin beyond ASCII
    chars(0x370, 0x52F),  # Greek, Cyrillic
    chars(0x590, 0x6FF),  # Hebrew, Arabic
    chars(0x900, 0xDFF),  # Indic scripts
    chars(0xE00, 0xEFF),  # Thai, Lao
    chars(0x3040, 0x30FF),  # kana
    chars(0x4E00, 0x9FFF),  # CJK
    chars(0xAC00, 0xD7A3),  # Hangul
    chars(0x20000, 0x2A6DF),  # CJK extension B: four bytes each
    chars(0x1F300, 0x1FAFF),  # emoji
    st.sampled_from(["\u200d", "\ufe0f", "\U0001f1ef", "\U0001f1f5", "\U0001f3fd"]),  # joiners
    st.characters(exclude_categories=("Cs",)),  # anything
]
RUNS = st.one_of([st.text(script, min_size=1, max_size=48) for script in SCRIPTS])
# The words the estimate counts one with their space, beside anything that may touch them.
WORDS = [word for word in (DATA / "whole_words.txt").read_text().splitlines() if word[:1] != "#"]
TOUCHING = st.sampled_from(["", " ", ".", ",", "'", "-", "\n", "(", "é", "中", "1", "s", "q", "X"])
PHRASES = st.lists(
    st.tuples(TOUCHING, st.sampled_from(WORDS)).map("".join), min_size=1, max_size=30
).map("".join)
TEXTS = st.lists(st.one_of(RUNS, PHRASES), min_size=1, max_size=10).map("".join)


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=TEXTS)
@example(text="0123456789" * 120)  # the 1,200 digits
@example(text="👨‍👩‍👧‍👦🇯🇵🇩🇪👍🏽" * 20)
@example(text="𠀀𠀁𠀂𠀃" * 50)
@example(text="a.b,c;d:e!f?g" * 40)
@example(text=" q X z J" * 40)
def test_the_estimate_is_never_under_gemma_3s_count(gemma, text):
    assert approx_tokens(text) >= counted(gemma, text), text


PROSE = [
    "The harbour wakes before the town does. At first light the fishing boats slip their "
    "moorings one by one, their engines coughing into the cold air, and the gulls rise from the "
    "breakwater in a single loud cloud. By the time the bakery on the corner opens its shutters, "
    "the last of the boats has rounded the lighthouse and the water inside the harbour has gone "
    "still again, grey and flat as a sheet of slate.",
    "How do I reset my password? I changed my phone and the authenticator app no longer works, "
    "so I cannot sign in. Can you help me recover the account without losing my saved settings "
    "and my order history?",
    "If you ask the people who live here what they like best about the place, they will not talk "
    "about the lighthouse at all. They will tell you about the market on Saturday mornings, about "
    "the long walk along the cliffs to the next village, about the way the whole bay turns gold "
    "for a few minutes in the evening when the sun drops behind the hills.",
]


@pytest.mark.parametrize("text", PROSE)
def test_english_prose_is_not_priced_far_above_its_count(gemma, text):
    real = counted(gemma, text)
    assert real <= approx_tokens(text) <= PROSE_CEILING * real, (approx_tokens(text), real)


PROSE_CEILING = 2.0
