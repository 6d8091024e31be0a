"""The gateway's own Prometheus metrics, counted where requests are served (read at /metrics,
config.metrics).

Each process (every daphne, the Celery worker) keeps its counts in prometheus_client's
multiprocess files in PROMETHEUS_MULTIPROC_DIR, which config.bootstrap sets before any app
imports prometheus_client; /metrics adds up the files of every process of the host. A count is
a few writes to memory: no query, no round trip, nothing per token.

Label values come from fixed sets (interface, road, status, KB method, error code, personal data
type, injection kind, what came of them) or from names an admin created (rule, endpoint); never a
user, key, question, session or KB entry, each of which would give every one of them its own
series; never a personal data value. A value outside its set is counted as "other", so a new code
or a bug cannot flood Prometheus.

The KB hit ratio is hits over hits and misses, by method if wanted:
    sum(rate(gateway_kb_lookups_total{result="hit"}[5m]))
      / sum(rate(gateway_kb_lookups_total{result=~"hit|miss"}[5m]))

Contract used by chat.turns and chat.openai_api; none of these raises into a request:
- request_started(interface): a turn began (in-flight gauge up).
- request_ended(record): the turn ended (in-flight down; counters and histograms from the record).
- response_refused(interface, status, code): a /v1 reply with an error status (401, 400, 429,
  502...).
"""

from __future__ import annotations

import atexit
import logging
import os

from prometheus_client import Counter, Gauge, Histogram, multiprocess, values

from inference_ops.exceptions import EngineError
from observability.models import REQUEST_FEATURES, RequestLog
from observability.requestlog import RequestRecord
from privacy.detector import TYPES as PERSONAL_DATA_TYPES
from privacy.injection import KINDS as INJECTION_KINDS

logger = logging.getLogger(__name__)

OTHER = "other"
INTERFACES = frozenset(RequestLog.Interface.values)
APIS = frozenset(RequestLog.Api.values)
STATUSES = frozenset(RequestLog.Status.values)
ROADS = frozenset({"kb", "local", "external", ""})
FEATURE_NAMES = frozenset(REQUEST_FEATURES)
# The screening's findings and what came of them ("": none noted); never the values themselves.
PERSONAL_DATA_NAMES = frozenset(PERSONAL_DATA_TYPES)
PERSONAL_DATA_ACTIONS = frozenset(RequestLog.PersonalDataAction.values) | {""}
INJECTION_NAMES = frozenset(INJECTION_KINDS)
INJECTION_ACTIONS = frozenset(RequestLog.InjectionAction.values) | {""}
KB_METHODS = frozenset({"exact", "typo", "vector", "none", "follow_up"})
# Every code a turn ends with (routing.pipeline's, an engine failure's kind) and every code /v1
# answers with (chat.openai_api, after its renames); "" is a reply without a code.
ERROR_CODES = frozenset(EngineError.KINDS) | frozenset(
    {
        "",
        "cancelled",
        "empty",
        "too_long",
        "unknown_model",
        "model_not_allowed",
        "no_route",
        "no_target",
        "unavailable",
        "context_length_exceeded",
        "model_not_found",
        "invalid_api_key",
        "insufficient_scope",
        "invalid_text",
        "invalid_session",
        "invalid_message",
        "rate_limit_exceeded",
        "rate_limited",
        "message_too_large",
        "session_not_found",
        "not_found",
        "method_not_allowed",
        "bad_host",
        "https_required",
        "request_too_large",
        "internal_error",
        "invalid",
        "limit_exceeded",
        "budget_exceeded",
        "limits_unavailable",
        "insufficient_quota",
        # /v1's completions and embeddings (chat.openai_api; routing.completions, .embeddings).
        "unsupported_api",
        "unsupported_parameter",
        "too_many_inputs",
        "input_too_large",
        "draining",
        # Refused for what the screening found (routing.screening).
        "personal_data",
        "prompt_injection",
    }
)
# Rule and endpoint names are slugs of at most this length; anything longer is not one.
NAME_LIMIT = 100

# From a KB answer (milliseconds) to a long generation (tens of seconds).
TIME_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
# The gateway's own share is small unless something is wrong.
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

REQUESTS = Counter(
    "gateway_requests_total",
    "Answered requests (turns), by how they ended.",
    ["interface", "road", "rule", "target", "status"],
)
REQUEST_ERRORS = Counter(
    "gateway_request_errors_total",
    "Turns that failed, broke off or were cancelled, by error code.",
    ["interface", "road", "target", "code"],
)
TTFT = Histogram(
    "gateway_time_to_first_token_seconds",
    "Arrival to the first token the user got.",
    ["interface", "road", "target"],
    buckets=TIME_BUCKETS,
)
LATENCY = Histogram(
    "gateway_request_duration_seconds",
    "Arrival to the end of the answer.",
    ["interface", "road", "target", "status"],
    buckets=TIME_BUCKETS,
)
OVERHEAD = Histogram(
    "gateway_overhead_seconds",
    "The gateway's own share of a request's time (the rest is the engine's).",
    ["interface", "road", "target"],
    buckets=OVERHEAD_BUCKETS,
)
PROMPT_TOKENS = Counter(
    "gateway_prompt_tokens_total",
    "Tokens in (prompt), as the engine counted them.",
    ["interface", "road", "target"],
)
COMPLETION_TOKENS = Counter(
    "gateway_completion_tokens_total",
    "Tokens out (completion), as the engine counted them.",
    ["interface", "road", "target"],
)
SPEND = Counter(
    "gateway_spend_total",
    "Money spent, in SPEND_CURRENCY, by the endpoints' prices (spend.prices); per key, user and "
    "group in the request log and the dashboard, never as labels here.",
    ["interface", "road", "target"],
)
KB_LOOKUPS = Counter(
    "gateway_kb_lookups_total",
    "KB checks by how they matched; result hit, miss, or skipped (a "
    "follow-up question, which only its conversation can answer).",
    ["method", "result"],
)
FALLBACKS = Counter(
    "gateway_fallbacks_total",
    "Endpoints passed over (failed or resting) before the answer, with the "
    "target that answered (empty: none did).",
    ["passed_over", "target"],
)
RETRIES = Counter(
    "gateway_retries_total",
    "Same-target retries before the first token, by endpoint and the failure retried (its code).",
    ["endpoint", "code"],
)
RETRY_WAIT = Counter(
    "gateway_retry_wait_seconds_total",
    "Time requests waited before retrying an endpoint (backoff or its Retry-After).",
    ["endpoint"],
)
SKIPPED_CHUNKS = Counter(
    "gateway_stream_chunks_skipped_total",
    "Unreadable chunks of an engine's stream passed over, by the target that sent them.",
    ["target"],
)
CONTINUATIONS = Counter(
    "gateway_continuations_total",
    "Answers whose stream broke after their first tokens and were finished from where they were "
    "cut (an assistant prefill), by the endpoint that continued them.",
    ["target"],
)
FEATURES = Counter(
    "gateway_request_features_total",
    "Requests that asked a model for more than text, by what they asked "
    "(observability.models.REQUEST_FEATURES): tools, tool_calls (the model called one), "
    "tool_results, structured, logprobs, n, media.",
    ["interface", "feature"],
)
PERSONAL_DATA = Counter(
    "gateway_personal_data_total",
    "Requests holding a personal data type (privacy.detector.TYPES), by type and where the "
    "question went: local, redacted, sent (to an endpoint allowed the type), refused. A request "
    "holding two types counts once under each.",
    ["type", "action"],
)
PROMPT_INJECTIONS = Counter(
    "gateway_prompt_injections_total",
    "Requests with a suspected prompt injection, by its kind and what came of it: logged, "
    "routed (by a rule written for it), refused.",
    ["kind", "action"],
)
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight",
    "Turns being answered now.",
    ["interface"],
    multiprocess_mode="livesum",
)
API_REQUESTS = Counter(
    "gateway_api_requests_total",
    "Answered requests by the API they called (chat; /v1's completions and embeddings) and how "
    "they ended; their times, tokens and spend are in the series above, by interface.",
    ["interface", "api", "status"],
)
ERROR_RESPONSES = Counter(
    "gateway_error_responses_total",
    "/v1 replies with an error status, by status and code.",
    ["interface", "status", "code"],
)


def request_started(interface: str) -> None:
    try:
        _child(IN_FLIGHT, _one_of(interface, INTERFACES)).inc()
    except Exception:  # a count must never cost a user their answer
        logger.exception("metrics: request_started failed")


def request_ended(record: RequestRecord) -> None:
    try:
        _ended(record)
    except Exception:
        logger.exception("metrics: request_ended failed")


def response_refused(interface: str, status: int, code: str) -> None:
    try:
        _child(
            ERROR_RESPONSES,
            _one_of(interface, INTERFACES),
            str(status) if 400 <= status <= 599 else OTHER,
            _one_of(code or "", ERROR_CODES),
        ).inc()
    except Exception:
        logger.exception("metrics: response_refused failed")


def _ended(record: RequestRecord) -> None:
    interface = _one_of(record.interface, INTERFACES)
    _child(IN_FLIGHT, interface).dec()
    road = _one_of(record.road, ROADS)
    # A KB answer's target is its entry: one series per entry would grow with the KB.
    target = "kb" if road == "kb" else _name(record.target)
    status = _one_of(record.status, STATUSES)
    _child(REQUESTS, interface, road, _name(record.rule), target, status).inc()
    _child(API_REQUESTS, interface, _one_of(record.api, APIS), status).inc()
    _child(LATENCY, interface, road, target, status).observe(record.latency_ms / 1000)
    if record.ttft_ms is not None:
        _child(TTFT, interface, road, target).observe(record.ttft_ms / 1000)
    if record.overhead_ms is not None:
        _child(OVERHEAD, interface, road, target).observe(record.overhead_ms / 1000)
    if record.prompt_tokens:
        _child(PROMPT_TOKENS, interface, road, target).inc(record.prompt_tokens)
    if record.completion_tokens:
        _child(COMPLETION_TOKENS, interface, road, target).inc(record.completion_tokens)
    if record.cost:
        _child(SPEND, interface, road, target).inc(record.cost)
    if record.error_code:
        _child(
            REQUEST_ERRORS, interface, road, target, _one_of(record.error_code, ERROR_CODES)
        ).inc()
    if record.kb_method:
        method = _one_of(record.kb_method, KB_METHODS)
        result = "hit" if record.kb_hit else "skipped" if method == "follow_up" else "miss"
        _child(KB_LOOKUPS, method, result).inc()
    for passed_over in record.fell_back_from:
        _child(FALLBACKS, _name(passed_over), target).inc()
    for endpoint, cause, wait in record.retried:
        _child(RETRIES, _name(endpoint), _one_of(cause, ERROR_CODES)).inc()
        _child(RETRY_WAIT, _name(endpoint)).inc(wait)
    for continuing in record.continued:
        _child(CONTINUATIONS, _name(continuing)).inc()
    if record.skipped_chunks:
        _child(SKIPPED_CHUNKS, target).inc(record.skipped_chunks)
    if record.features:
        for feature in record.features.split():
            _child(FEATURES, interface, _one_of(feature, FEATURE_NAMES)).inc()
    if record.personal_data:
        action = _one_of(record.personal_data_action, PERSONAL_DATA_ACTIONS)
        for found in record.personal_data.split():
            _child(PERSONAL_DATA, _one_of(found, PERSONAL_DATA_NAMES), action).inc()
    if record.injection:
        _child(
            PROMPT_INJECTIONS,
            _one_of(record.injection, INJECTION_NAMES),
            _one_of(record.injection_action, INJECTION_ACTIONS),
        ).inc()


# Each series' child, found once: prometheus_client's labels() costs more than the count itself.
# As many entries as there are series, which the label sets above keep bounded.
_children: dict[tuple, Counter | Gauge | Histogram] = {}


def _child(metric, *labels: str):
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def _one_of(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


def _name(value: str | None) -> str:
    if not value:
        return ""
    return value if len(value) <= NAME_LIMIT else OTHER


def _process_exit() -> None:
    # The in-flight gauge of a process that is gone must not count. A killed process cannot do
    # this; its last in-flight count stays until the folder is emptied before the next start.
    multiprocess.mark_process_dead(os.getpid())


if values.ValueClass is values.MutexValue:
    # Something imported prometheus_client before config.bootstrap set the folder: this process
    # counts in its own memory, which no scrape of the folder sees.
    logger.warning(
        "metrics: prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set; "
        "this process's counts are missing from /metrics"
    )
else:
    atexit.register(_process_exit)
