"""Spend: the currency of prices and budgets, and what the limits do while Redis is away."""

from core.env import env_choice, env_str

# The currency of the endpoints' prices and of the budgets (a label: nothing is converted).
SPEND_CURRENCY = env_str("SPEND_CURRENCY", "USD")
# Redis unreachable, so the per-user limits (CHAT_RATE_LIMIT, the stream slots and the spend
# limits) cannot be counted: "closed" refuses the requests they cover (503, retryable; nothing
# goes uncounted), "open" lets them through uncounted. Both are logged and counted in
# gateway_spend_unchecked_total.
LIMITS_ON_REDIS_OUTAGE = env_choice("LIMITS_ON_REDIS_OUTAGE", "closed", ("closed", "open"))
