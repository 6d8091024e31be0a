"""Default routing for `make run`: KB first (the pipeline always asks it), long-form writing,
translation and compare/analyse requests to the external model when one is configured (else the
local one), everything else to the local engine with the external one as fallback. An API client
that names the local model gets it without KB context (naming a model skips the KB, not the rules:
see `routing.compiled.named_target`). Only missing rows are created, so a curator's edits survive
the next start."""

from typing import Any

from django.conf import settings
from django.db import transaction

from inference_ops.models import ModelEndpoint
from routing.models import RouteTarget, RoutingRule

HEAVY_KEYWORDS = [
    "translate",
    "translation",
    "compare",
    "comparison",
    "analyse",
    "analyze",
    "analysis",
    "翻译",
    "译成",
    "比较",
    "对比",
    "分析",
]
LONG_FORM_EXAMPLES = [
    "Write a detailed essay about the history of the printing press",
    "Draft a two-page report on our quarterly sales",
    "Write a long blog post explaining how vaccines work",
    "写一篇关于人工智能的长文章",
]


def external_endpoint_ensure() -> ModelEndpoint | None:
    """The external endpoint from EXTERNAL_LLM_* settings, if they name one."""
    if not (settings.EXTERNAL_LLM_BASE_URL and settings.EXTERNAL_LLM_MODEL):
        return None
    endpoint, _ = ModelEndpoint.objects.get_or_create(
        name="external",
        defaults={
            "kind": ModelEndpoint.Kind.EXTERNAL,
            "base_url": settings.EXTERNAL_LLM_BASE_URL,
            "model": settings.EXTERNAL_LLM_MODEL,
            "api_key_env": settings.EXTERNAL_LLM_API_KEY_ENV,
            "context_window": settings.EXTERNAL_LLM_CONTEXT_WINDOW,
            "first_token_timeout": 60,
        },
    )
    return endpoint


@transaction.atomic
def _intent_threshold() -> float:
    """An intent threshold is a similarity in the serving model's scale: the demo rule takes the
    configured model's (knowledge.embedding.OPERATING_POINTS)."""
    from django.conf import settings

    from knowledge.embedding import operating_point

    return operating_point(settings.KB_EMBEDDING_MODEL or "").intent


def demo_rules_ensure(*, local: ModelEndpoint, external: ModelEndpoint | None) -> list[str]:
    """Create the default rules that do not exist yet; returns the names created."""
    created = []
    heavy = external or local
    specs: list[tuple[str, int, dict[str, Any], list[ModelEndpoint]]] = [
        # A client that names the local model gets it as it is: no KB context, no escalation.
        (
            "local model by name",
            5,
            {"requested_models": [local.name], "use_kb_context": False},
            [local],
        ),
        (
            "translation and analysis",
            10,
            {"keywords": HEAVY_KEYWORDS},
            [heavy] + ([local] if external else []),
        ),
        (
            "long-form writing",
            20,
            {"intent_examples": LONG_FORM_EXAMPLES, "intent_threshold": _intent_threshold()},
            [heavy] + ([local] if external else []),
        ),
        ("default", 1000, {"is_default": True}, [local] + ([external] if external else [])),
    ]
    for name, priority, conditions, chain in specs:
        if RoutingRule.objects.filter(name=name).exists():
            continue
        rule = RoutingRule.objects.create(name=name, priority=priority, **conditions)
        for position, endpoint in enumerate(chain, start=1):
            RouteTarget.objects.create(rule=rule, position=position, endpoint=endpoint)
        created.append(name)
    return created
