"""An engine's state change: stored on its row with its reason, mirrored on its endpoint,
recorded as an EngineEvent, and told after commit to the staff's ops socket, the answer
pipeline's view of the engines (engine_state) and the receivers of `engine_ready`."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from core.events import ops_event_broadcast
from inference_ops import engine_state
from inference_ops.models import EngineEvent, EngineProcess, ModelEndpoint
from inference_ops.signals import engine_ready

logger = logging.getLogger(__name__)
Status = EngineProcess.Status

_ENDPOINT_STATUS: dict[str, str] = {
    Status.READY: ModelEndpoint.Status.READY,
    Status.UNHEALTHY: ModelEndpoint.Status.UNHEALTHY,
}


def transition(engine: EngineProcess, status: str, reason: str, **fields) -> EngineProcess:
    """Store a state change with its reason, mirror it on the endpoint, tell staff after commit."""
    changed = status != engine.status or reason != engine.status_reason
    previous = engine.status
    now = timezone.now()
    fields.update(status=status, status_reason=reason[:1000])
    if changed:
        fields["status_changed_at"] = now
    with transaction.atomic():
        EngineProcess.objects.filter(pk=engine.pk).update(**fields)
        for name, value in fields.items():
            setattr(engine, name, value)
        if changed:
            if status == Status.READY and previous != Status.READY:
                endpoint = (
                    ModelEndpoint.objects.filter(pk=engine.endpoint_id)
                    .values_list("name", flat=True)
                    .first()
                )
                transaction.on_commit(lambda: _ready(engine, endpoint))
            EngineEvent.objects.create(engine=engine, status=status, reason=reason[:1000])
            ModelEndpoint.objects.filter(pk=engine.endpoint_id).update(
                status=_ENDPOINT_STATUS.get(status, ModelEndpoint.Status.DOWN),
                status_reason=reason[:500],
                checked_at=now,
            )
            payload = {"engine": engine.name, "status": status, "reason": reason}
            transaction.on_commit(lambda: _broadcast(payload))
            if status != previous:
                transaction.on_commit(engine_state.changed)
    if changed:
        logger.info("engine %s: %s (%s)", engine.name, status, reason)
    return engine


def _ready(engine: EngineProcess, endpoint: str | None) -> None:
    # Answers failed while the engine was away, so its endpoint's circuit breaker is likely open;
    # the engine is back now, and waiting out the breaker's cool-down would only refuse service.
    if endpoint is None:
        return
    try:
        engine_ready.send(sender=EngineProcess, engine=engine, endpoint=endpoint)
    except Exception:  # a receiver's failure must never fail supervision
        logger.warning("engine %s: a receiver of engine_ready failed", engine.name, exc_info=True)


def _broadcast(payload: dict) -> None:
    try:
        ops_event_broadcast(kind="engine.status", data=payload)
    except Exception:  # a lost notification must never fail supervision
        logger.warning("could not broadcast engine status", exc_info=True)
