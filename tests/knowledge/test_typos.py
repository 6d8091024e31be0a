"""The typo road (knowledge.typos): a question one or two characters off a curated phrasing gets
that entry's answer directly; a question as close to a phrasing that means something else gets
none. On the labelled KB's typo set (benchmarks/kb_typos.py) and its near misses."""

import json

import pytest
from asgiref.sync import sync_to_async

from benchmarks import kb_typos
from knowledge import typos
from knowledge.importing import kb_import
from knowledge.models import Entry
from knowledge.normalize import normalize
from knowledge.selectors import adirect_answer, direct_answer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_index():
    typos.index_forget()
    yield
    typos.index_forget()


def _load(ids: set[str] | None = None) -> dict[int, str]:
    """The labelled KB's entries (those of `ids`, or all), imported without vectors: only the
    exact and typo roads can answer. Their row ids and labelled ids."""
    lines = [
        line
        for line in kb_typos.ENTRIES.read_text().splitlines()
        if ids is None or json.loads(line)["id"] in ids
    ]
    assert not kb_import(text="\n".join(lines), fmt="jsonl", embed="none").errors
    return dict(Entry.objects.values_list("pk", "external_id"))


def test_typos_of_a_curated_phrasing_get_its_answer_and_none_gets_another():
    labels = _load()
    cases = kb_typos.typo_cases()
    assert len(cases) >= 100
    right, wrong = [], []
    for case in cases:
        verdict = direct_answer(case.question)
        if verdict.hit:
            assert verdict.method in ("exact", "typo")
            (right if labels[verdict.entry.pk] == case.expected else wrong).append(case)
    assert wrong == []
    assert len(right) / len(cases) >= 0.9, [c.question for c in cases if c not in right]


def test_near_misses_one_or_two_characters_off_get_no_direct_answer():
    phrasings = {normalize(phrasing) for _, phrasing in kb_typos.NEAR_MISSES}
    owners = {
        entry_id
        for entry_id, phrasing in kb_typos.english_faq_phrasings()
        if normalize(phrasing) in phrasings
    }
    _load(owners)
    answered = {
        case.question: direct_answer(case.question).entry.question
        for case in kb_typos.near_miss_cases()
        if direct_answer(case.question).hit
    }
    assert answered == {}


@pytest.mark.parametrize(
    "question, phrasing",
    [
        ("cancle my order", "cancel my order"),
        ("how do i reset my pasword", "how do i reset my password"),
        ("how do i resett my pasword", "how do i reset my password"),  # two off, a long phrasing
        ("cnacel my subscriptoin", "cancel my subscription"),  # two swaps
        ("my subsrciptin", "my subscription"),  # two in one long word
        ("pass word", "password"),
        ("i forgotmy password", "i forgot my password"),
    ],
)
def test_what_reads_as_a_typo(question, phrasing):
    assert typos.plausible_typo(question, phrasing)


@pytest.mark.parametrize(
    "question, phrasing, why",
    [
        ("how do i export contacts", "how do i import contacts", "first letter changed"),
        ("turn off 2fa", "turn on 2fa", "a short word"),
        ("delete my cart", "delete my card", "a common word"),
        ("enable 3fa", "enable 2fa", "a digit"),
        ("what is qlora", "what is lora", "first letter changed"),
        ("how do i reset password", "how do i reset my password", "a word more"),
        ("can i pay with paypay", "can i pay with paypal", "y is far from l on a keyboard"),
    ],
)
def test_what_reads_as_other_words(question, phrasing, why):
    assert not typos.plausible_typo(question, phrasing), why


def test_a_typo_close_to_two_entries_is_not_answered():
    # A question copied into two entries: the KB cannot tell which one a typo of it means.
    index = typos.TypoIndex([(1, "reset my password"), (2, "reset my password")])
    assert index.find("reset my pasword") is None
    index = typos.TypoIndex([(1, "reset my password"), (2, "reset my passcode")])
    assert index.find("reset my pasword") == typos.Typo(1, "reset my password", 1)


def test_a_short_question_takes_one_character_at_most_and_chinese_none():
    index = typos.TypoIndex([(1, "refund time"), (2, "如何取消订单"), (3, "cancel my order")])
    assert index.find("refnd tme") is None  # two off a phrasing under KB_TYPO_LONG characters
    assert index.find("refnd time") == typos.Typo(1, "refund time", 1)
    assert index.find("如何取消定单") is None
    assert index.find("cancel my ordr").entry_id == 3


@pytest.mark.django_db(transaction=True)  # the event loop's pool reads what the test wrote
async def test_the_async_road_answers_a_typo_and_says_so():
    await sync_to_async(_load)({"password-reset"})
    verdict = await adirect_answer("How do I resett my password?")
    assert verdict.hit and verdict.method == "typo"
    assert verdict.entry.question == "How do I reset my password?"
    assert (
        verdict.reason == "one character off the phrasing 'how do i reset my password' (normalized)"
    )


def test_a_curators_change_reaches_the_road_and_the_switch_turns_it_off(settings):
    _load({"password-reset"})
    assert direct_answer("forgot pasword").method == "typo"
    entry = Entry.objects.get(question="How do I reset my password?")
    entry.active = False
    entry.save(update_fields=["active"])
    typos.index_forget()  # what KB_TYPO_INDEX_SECONDS does in another process
    assert not direct_answer("forgot pasword").hit
    entry.active = True
    entry.save(update_fields=["active"])
    settings.KB_TYPO_INDEX_SECONDS = 0.0  # every lookup reads the digest
    assert direct_answer("forgot pasword").method == "typo"
    settings.KB_TYPO_ROAD = False
    assert not direct_answer("forgot pasword").hit
