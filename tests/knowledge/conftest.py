import pytest
from rest_framework.test import APIClient

from knowledge.services.entries import entry_create


@pytest.fixture
def staff(admin_user):
    """An API client signed in as a staff superuser."""
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


FAQ = [
    (
        "How do I cancel my order?",
        ["cancel an order"],
        "Open **Orders**, pick the order and press *Cancel*.",
    ),
    ("How do I cancel my subscription?", [], "Go to Settings → Billing → Cancel subscription."),
    ("What is LoRA?", [], "Low-Rank Adaptation: small trainable matrices added to a frozen model."),
    ("What is QLoRA?", [], "LoRA trained on top of a 4-bit quantized base model."),
    (
        "How do I reset my password?",
        ["forgot password"],
        "Use *Forgot password* on the login page.",
    ),
    ("What are your opening hours?", [], "Monday to Friday, 9:00 to 18:00."),
    ("如何取消订单？", ["怎样取消订单"], "在订单页面点击取消。"),
    ("如何取消订阅？", [], "在账户设置中取消订阅。"),
]

RULE = (
    "Refund policy",
    "Refunds are possible within 30 days of delivery. Money goes back to the original payment "
    "method within five working days. Opened software is not refundable.",
)

HANDBOOK = "\n\n".join(
    [
        "Parcels leave our warehouse within two working days of payment.",
        "International shipping takes between five and twelve days, depending on customs.",
        "Fragile goods are packed in double boxes with foam; we insure them at no extra cost.",
        "If a parcel arrives damaged, photograph the box before opening and contact support "
        "within 48 hours.",
    ]
)


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
