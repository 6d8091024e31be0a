"""Health checks of the endpoints no engine row of ours runs (routers, servers started by someone
else): the same probes as an engine's, written on the endpoint row. Run by Celery beat's
`endpoints_check_all` on the default queue.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter

from inference_ops import admission
from inference_ops.models import EngineProcess, ModelEndpoint
from inference_ops.probes import probe_url
from inference_ops.signals import engine_ready

logger = logging.getLogger(__name__)
# Counted by the worker that runs the checks; /metrics adds up every process's counts
# (config.metrics).
ENDPOINT_CHECKS = Counter(
    "gateway_endpoint_checks_total",
    "Health checks of endpoints no engine row runs (routers), by result.",
    ["endpoint", "result"],
)


def endpoint_check(*, endpoint_id: int) -> str | None:
    """One check of an endpoint that no engine row of ours runs: a vLLM production-stack router,
    llm-d's inference gateway, a vLLM server started by someone else. The same checks as an
    engine's (/health, the model in /v1/models, the /metrics gauges, summed over the router's
    backends), written on the endpoint row, where /metrics, the dashboard and routing read them.
    An endpoint seen ready again closes its circuit breaker, as an engine's recovery does.
    Returns the endpoint's status, or None when there is nothing to check."""
    endpoint = ModelEndpoint.objects.filter(pk=endpoint_id, active=True).first()
    if (
        endpoint is None
        or endpoint.kind == ModelEndpoint.Kind.EXTERNAL
        or EngineProcess.objects.filter(endpoint_id=endpoint_id).exists()
    ):
        return None
    key = endpoint.api_key
    healthy, reason, metrics = probe_url(
        endpoint.base_url.rstrip("/").removesuffix("/v1"),
        endpoint.model,
        settings.ENGINE_CHECK_TIMEOUT,
        {"Authorization": f"Bearer {key}"} if key else None,
    )
    ENDPOINT_CHECKS.labels(endpoint.name, "healthy" if healthy else "unhealthy").inc()
    status = (
        ModelEndpoint.Status.READY
        if healthy
        else (
            ModelEndpoint.Status.DOWN
            if reason.startswith("no answer")
            else ModelEndpoint.Status.UNHEALTHY
        )
    )
    fields = {"status": status, "status_reason": reason[:500], "checked_at": timezone.now()}
    if healthy:
        fields.update(
            requests_running=metrics.get("running"),
            requests_waiting=metrics.get("waiting"),
            kv_cache_usage=metrics.get("kv_cache_usage"),
        )
    ModelEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
    if healthy and endpoint.capacity:
        admission.engine_report(name=endpoint.name, capacity=endpoint.capacity, metrics=metrics)
    if healthy and endpoint.status != ModelEndpoint.Status.READY:
        try:
            engine_ready.send(sender=ModelEndpoint, engine=None, endpoint=endpoint.name)
        except Exception:  # a receiver's failure must never fail the check
            logger.warning(
                "endpoint %s: a receiver of engine_ready failed", endpoint.name, exc_info=True
            )
    if status != endpoint.status:
        logger.info("endpoint %s: %s (%s)", endpoint.name, status, reason)
    return status
