"""The failover scorecard: what a caller gets from the gateway when the provider misbehaves.

Each scenario gives a primary and one fallback (two simulator processes, faults by model name:
`--fault MODEL=SPEC`) and is run twice through the real gateway over HTTP with the official
`openai` SDK streaming: **auto** (the client asks `auto`; a rule routes the question to the
primary, then the fallback) and **named** (the client names the primary's endpoint). The answers
are deterministic (a seeded simulator in random mode, `ignore_eos`, a fixed `max_tokens`), so
the whole answer is known before asking: the same request to a healthy simulator.

This module holds the scenarios, the plan and the gateway's rows for them; the rest of the
scorecard is in its neighbours: `failover_caller` (what the caller got, and its verdict),
`failover_recorder` (what the providers saw), `failover_run` (one run of the plan) and
`failover_report` (the table).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

VERDICTS = ("pass", "partial", "safe", "fail")  # best first
PRIMARY, FALLBACK = "primary", "fallback"
FALLBACK_MODEL = "fallback"  # the fallback simulator's healthy model
NO_PREFILL_MODEL = "fallback-no-prefill"
SEED = 20261206
REASON = "violence"
MODES = ("auto", "named")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    primary: str  # the primary's fault SPEC
    fallback: str | None = None  # the fallback's fault (None: healthy)
    kind: str = "answer"  # "answer", "refusal" (pass: a clean error with the reason), "flap"
    long_prompt: bool = False  # a prompt over the primary's window (context-length)
    primary_context_window: int = 4096
    accounting: bool = False  # usage must add every attempt's prompt


SCENARIOS = (
    Scenario("429-retry-after", "429 with Retry-After: 2, once", "429;retry-after=2;times=1"),
    Scenario("429-no-retry-after", "429 without Retry-After, once", "429;retry-after=none;times=1"),
    Scenario("500-once", "500 once", "500;times=1"),
    Scenario("503-always", "503 on every request", "503"),
    Scenario("reset", "connection reset before headers, once", "connect-close;times=1"),
    Scenario("no-response", "accepted, never answered", "hang"),
    Scenario("slow-first-token", "first token after 6 s", "slow-first-token;delay=6"),
    Scenario("cut-mid-stream", "connection cut after 8 tokens", "mid-stream;after=8;how=close"),
    Scenario("stall", "no token after the 8th, connection open", "stall;after=8"),
    Scenario("malformed-chunk", "one unreadable chunk after 8 tokens", "malformed;after=8"),
    Scenario("no-done", "stream ends after 8 tokens, no [DONE]", "no-done;after=8"),
    Scenario(
        "context-length",
        "prompt over the primary's 256-token window",
        "context-length;max-model-len=256",
        long_prompt=True,
        primary_context_window=256,
    ),
    Scenario(
        "content-filter",
        "content-policy refusal",
        f"content-filter;reason={REASON}",
        kind="refusal",
    ),
    Scenario(
        "prefill-refused",
        "cut after 8 tokens once; the fallback refuses prefill",
        "mid-stream;after=8;how=close;times=1",
        fallback="no-prefill",
    ),
    Scenario("flapping", "primary flaps: down 4 s, up 4 s", "flap;down=4;up=4", kind="flap"),
    Scenario(
        "accounting",
        "cut after 8 tokens: usage of every attempt",
        "mid-stream;after=8;how=close",
        accounting=True,
    ),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
QUICK = ("500-once", "cut-mid-stream", "no-done", "content-filter")


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...] = SCENARIOS
    max_tokens: int = 24
    deadline: float = 30.0  # per request, the whole answer, s
    first_token_timeout: float = 3.0  # the endpoints' (no-response, slow-first-token)
    idle_timeout: float = 2.0  # the endpoints' (stall)
    flap_seconds: float = 20.0  # how long the flapping scenario asks
    flap_interval: float = 1.0  # between its questions' starts
    ttft_ms: float = 20.0
    itl_ms: float = 10.0


def plan_quick(plan: Plan) -> Plan:
    """A short run for a test: four scenarios unless chosen, a shorter deadline and flap."""
    scenarios = plan.scenarios if plan.scenarios != SCENARIOS else tuple(BY_NAME[n] for n in QUICK)
    return replace(plan, scenarios=scenarios, deadline=20.0, flap_seconds=10.0)


def scenarios_pick(names: list[str]) -> tuple[Scenario, ...]:
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return tuple(BY_NAME[name] for name in names)


def model_of(scenario: Scenario, mode: str) -> str:
    """The primary simulator's model for a scenario and mode: each pair its own fault count."""
    return f"p-{scenario.name}-{mode}"


def endpoint_name(scenario: Scenario, mode: str, provider: str) -> str:
    return f"fo-{scenario.name}-{mode}" + ("-fb" if provider == FALLBACK else "")


def tag(scenario: Scenario, mode: str) -> str:
    # A word the rule's keyword matches (normalization drops punctuation), one per pair, none a
    # part of another.
    return f"zqfo{SCENARIOS.index(scenario):02d}{mode[0]}"


def simulator_args(plan: Plan, role: str) -> list[str]:
    """The flags of the primary or the fallback simulator: random mode (the text depends on the
    seed and the length only), its faults by model."""
    args = [
        "--mode",
        "random",
        "--time-to-first-token",
        f"{plan.ttft_ms:g}",
        "--inter-token-latency",
        f"{plan.itl_ms:g}",
    ]
    if role == PRIMARY:
        for scenario in plan.scenarios:
            for mode in MODES:
                args += ["--fault", f"{model_of(scenario, mode)}={scenario.primary}"]
    else:
        args += ["--fault", f"{NO_PREFILL_MODEL}=no-prefill"]
    return args


def messages_of(scenario: Scenario, mode: str) -> list[dict]:
    question = f"{tag(scenario, mode)} What does a lighthouse keeper do all day?"
    if scenario.long_prompt:
        question += " Some background:" + " the lamp was lit at dusk" * 60
    return [{"role": "user", "content": question}]


# --- the gateway's rows ---------------------------------------------------------------------------


def rows_create(*, plan: Plan, primary_url: str, fallback_url: str) -> None:
    """Per scenario and mode: a primary and a fallback endpoint (each its own breaker) and a rule
    taking the scenario's question to them in that order. Before the gateway starts."""
    from inference_ops.models import ModelEndpoint
    from routing.models import RouteTarget, RoutingRule

    names = [endpoint_name(s, m, p) for s in SCENARIOS for m in MODES for p in (PRIMARY, FALLBACK)]
    RoutingRule.objects.filter(name__startswith="failover ").delete()
    ModelEndpoint.objects.filter(name__in=names).delete()
    for scenario in plan.scenarios:
        for mode in MODES:
            timeouts = {
                "connect_timeout": 2.0,
                "first_token_timeout": plan.first_token_timeout,
                "idle_timeout": plan.idle_timeout,
                "total_timeout": plan.deadline,
            }
            primary = ModelEndpoint.objects.create(
                name=endpoint_name(scenario, mode, PRIMARY),
                kind=ModelEndpoint.Kind.VLLM,
                base_url=f"{primary_url}/v1",
                model=model_of(scenario, mode),
                context_window=scenario.primary_context_window,
                **timeouts,
            )
            fallback = ModelEndpoint.objects.create(
                name=endpoint_name(scenario, mode, FALLBACK),
                kind=ModelEndpoint.Kind.VLLM,
                base_url=f"{fallback_url}/v1",
                model=NO_PREFILL_MODEL if scenario.fallback == "no-prefill" else FALLBACK_MODEL,
                **timeouts,
            )
            rule = RoutingRule.objects.create(
                name=f"failover {scenario.name} {mode}",
                priority=1,
                keywords=[tag(scenario, mode)],
                use_kb_context=False,
            )
            RouteTarget.objects.create(rule=rule, position=1, endpoint=primary)
            RouteTarget.objects.create(rule=rule, position=2, endpoint=fallback)
