import pytest
from rest_framework.test import APIClient

from knowledge.services.entries import entry_create
from tests.support.faq import FAQ, HANDBOOK, RULE


@pytest.fixture
def staff(admin_user):
    """An API client signed in as a staff superuser."""
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture
def vector_point(settings):
    """An operating point looser than the served model's calibrated default (which, on the
    adversarial labelled set, answers few paraphrases), at which this small KB's paraphrases are
    vector hits: for tests of the vector road's mechanics, not of the default's precision. The
    margin leaves room for the int8 kernels' numbers, which differ from CPU to CPU: on one without
    VNNI, "explain LoRA" led its runner-up by 0.03997."""
    settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN = 0.90, 0.035
    return settings.KB_DIRECT_THRESHOLD, settings.KB_DIRECT_MARGIN


@pytest.fixture
def kb(db):
    entries = {}
    for question, aliases, answer in FAQ:
        entries[question] = entry_create(
            question=question, aliases=aliases, answer=answer, embed="sync"
        )
    entries["refund"] = entry_create(kind="rule", question=RULE[0], answer=RULE[1], embed="sync")
    entries["handbook"] = entry_create(
        kind="document", question="Shipping handbook", answer=HANDBOOK, embed="sync"
    )
    return entries
