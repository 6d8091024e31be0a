"""Routing: breakers, replica choice, token limits, the external model and the endpoint keys."""

from django.core.exceptions import ImproperlyConfigured

from core.env import env_choice, env_float, env_int, env_list, env_str, env_url

ROUTING_BREAKER_FAILURES = env_int("ROUTING_BREAKER_FAILURES", 5, minimum=1)  # in a row, to open
# A process trusts a breaker it found closed and clean this long without asking Redis again.
ROUTING_BREAKER_CHECK_SECONDS = env_float("ROUTING_BREAKER_CHECK_SECONDS", 0.5, minimum=0.0)
# An open breaker probes its endpoint after ROUTING_BREAKER_PROBE_FIRST seconds, then twice as long
# after each failed probe, at most ROUTING_BREAKER_COOLDOWN apart (routing.breaker).
ROUTING_BREAKER_PROBE_FIRST = env_float("ROUTING_BREAKER_PROBE_FIRST", 1.0, minimum=0.1)
ROUTING_BREAKER_COOLDOWN = env_float("ROUTING_BREAKER_COOLDOWN", 8.0, minimum=0.1)
# The longest an endpoint's Retry-After (429/503) keeps it skipped.
ROUTING_MAX_RETRY_AFTER = env_float("ROUTING_MAX_RETRY_AFTER", 120.0, minimum=0.0)
# How often a process asks Redis whether the rules changed: a change reaches every process within
# it.
ROUTING_RULES_CHECK_SECONDS = env_float("ROUTING_RULES_CHECK_SECONDS", 1.0, minimum=0.0)
# Replica groups (routing.replicas): the least busy replica answers (its engine's queue, running
# requests and KV-cache use as scraped by the health checks, read at most every ROUTING_LOAD_SECONDS
# and trusted for ROUTING_LOAD_FRESH_SECONDS, plus this process's requests in flight); a
# conversation stays on its replica while that is at most ROUTING_AFFINITY_SLACK requests busier.
# round_robin: the plain rotation, for comparison.
ROUTING_REPLICA_PICK = env_choice(
    "ROUTING_REPLICA_PICK", "least_busy", ("least_busy", "round_robin")
)
ROUTING_LOAD_SECONDS = env_float("ROUTING_LOAD_SECONDS", 1.0, minimum=0.1)
ROUTING_LOAD_FRESH_SECONDS = env_float("ROUTING_LOAD_FRESH_SECONDS", 15.0, minimum=1.0)
ROUTING_RUNNING_WEIGHT = env_float(
    "ROUTING_RUNNING_WEIGHT", 0.25, minimum=0.0
)  # a running request, in queued ones
ROUTING_KV_WEIGHT = env_float(
    "ROUTING_KV_WEIGHT", 4.0, minimum=0.0
)  # a full KV cache, in queued requests
ROUTING_AFFINITY_SLACK = env_float("ROUTING_AFFINITY_SLACK", 2.0, minimum=0.0)
ROUTING_MAX_INPUT_CHARS = env_int("ROUTING_MAX_INPUT_CHARS", 32000, minimum=100)
ROUTING_DEFAULT_MAX_TOKENS = env_int("ROUTING_DEFAULT_MAX_TOKENS", 512, minimum=1)
# The most max_tokens a client may have under a rule that sets none (it asks for more: it gets
# this). A rule's own max_tokens is its ceiling instead: the operator's cap on what a model may
# spend.
ROUTING_MAX_TOKENS_CEILING = env_int(
    "ROUTING_MAX_TOKENS_CEILING", max(4096, ROUTING_DEFAULT_MAX_TOKENS), minimum=1
)
if ROUTING_MAX_TOKENS_CEILING < ROUTING_DEFAULT_MAX_TOKENS:
    raise ImproperlyConfigured(
        "Environment variable ROUTING_MAX_TOKENS_CEILING "
        f"({ROUTING_MAX_TOKENS_CEILING}) must be at least "
        f"ROUTING_DEFAULT_MAX_TOKENS ({ROUTING_DEFAULT_MAX_TOKENS}): "
        "the default answer length is under the ceiling."
    )
ROUTING_KB_NO_ANSWER = env_str(
    "ROUTING_KB_NO_ANSWER", "Sorry, the knowledge base has no answer to that question yet."
)
# An external OpenAI-compatible model for make run's demo routing (any provider, or another vLLM).
EXTERNAL_LLM_BASE_URL = env_url("EXTERNAL_LLM_BASE_URL", schemes=("http", "https"), default="")
EXTERNAL_LLM_MODEL = env_str("EXTERNAL_LLM_MODEL", "")
EXTERNAL_LLM_API_KEY_ENV = env_str("EXTERNAL_LLM_API_KEY_ENV", "")
EXTERNAL_LLM_CONTEXT_WINDOW = env_int("EXTERNAL_LLM_CONTEXT_WINDOW", 128000, minimum=256)
# An endpoint row's `api_key_env` may only name a variable with this prefix, one listed here, or
# EXTERNAL_LLM_API_KEY_ENV: its value leaves as a Bearer token for the row's URL
# (inference_ops/policy.py).
ENDPOINT_KEY_ENV_PREFIX = env_str("ENDPOINT_KEY_ENV_PREFIX", "GW_KEY_")
if len(ENDPOINT_KEY_ENV_PREFIX) < 3 or not ENDPOINT_KEY_ENV_PREFIX.endswith("_"):
    raise ImproperlyConfigured(
        "Environment variable ENDPOINT_KEY_ENV_PREFIX must be at least 3 characters ending in '_'; "
        f"got {ENDPOINT_KEY_ENV_PREFIX!r}."
    )
ENDPOINT_KEY_ENV_NAMES = env_list("ENDPOINT_KEY_ENV_NAMES")
ROUTING_SYSTEM_PROMPT = env_str(
    "ROUTING_SYSTEM_PROMPT",
    "You are a helpful, precise assistant. Answer in the language of the question.",
)
