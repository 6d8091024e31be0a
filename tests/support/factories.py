"""Rows for tests: endpoints and routing rules."""

from inference_ops.models import ModelEndpoint
from routing.models import RouteTarget, RoutingRule


def endpoint(name, sim=None, *, kind="vllm", model=None, url=None, **fields):
    base = url or f"{sim.url}/v1"
    return ModelEndpoint.objects.create(
        name=name,
        kind=kind,
        base_url=base,
        model=model or ("acme/local" if kind != "external" else "acme/external"),
        **{
            "connect_timeout": 1,
            "first_token_timeout": 2,
            "idle_timeout": 2,
            "total_timeout": 20,
            **fields,
        },
    )


def rule(name, *targets, priority=100, **fields):
    """A rule; each positional target is an endpoint, or a list of (endpoint, weight) at one
    position."""
    created = RoutingRule.objects.create(name=name, priority=priority, **fields)
    for position, spec in enumerate(targets, start=1):
        specs = spec if isinstance(spec, list) else [(spec, 100)]
        for item in specs:
            target_endpoint, weight = item if isinstance(item, tuple) else (item, 100)
            RouteTarget.objects.create(
                rule=created, position=position, endpoint=target_endpoint, weight=weight
            )
    return created
