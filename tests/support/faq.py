"""The small knowledge base the KB tests share: FAQ entries in English and Chinese (some near
each other on purpose: cancel an order or a subscription, LoRA or QLoRA), a rule and a document."""

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
