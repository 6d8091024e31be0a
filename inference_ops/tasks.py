"""Engine supervision tasks. They run on the engine's own queue (`ops` or `ops.<host>`),
take ids, re-read the row, and are safe to run twice."""

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Q

from core import redis as core_redis
from inference_ops import endpoint_checks, lora, supervisor
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineProcess, LoraAdapter, ModelEndpoint

logger = logging.getLogger(__name__)

# vLLM may take many minutes to load weights; the global limits are for ordinary tasks.
_START_LIMITS: dict[str, Any] = {"soft_time_limit": 3600, "time_limit": 3660}


@shared_task(name="inference_ops.tasks.engine_start", **_START_LIMITS)
def engine_start_task(engine_id: int, reason: str = "started by an operator") -> str:
    if not EngineProcess.objects.filter(pk=engine_id).exists():
        return "gone"
    try:
        return supervisor.engine_start(engine_id=engine_id, reason=reason).status
    except SupervisorError as exc:
        logger.warning("%s", exc)
        return f"failed: {exc}"


@shared_task(name="inference_ops.tasks.engine_stop")
def engine_stop_task(engine_id: int, reason: str = "stopped by an operator") -> str:
    if not EngineProcess.objects.filter(pk=engine_id).exists():
        return "gone"
    return supervisor.engine_stop(engine_id=engine_id, reason=reason).status


@shared_task(name="inference_ops.tasks.engine_restart", **_START_LIMITS)
def engine_restart_task(engine_id: int, reason: str = "restarted by an operator") -> str:
    if not EngineProcess.objects.filter(pk=engine_id).exists():
        return "gone"
    try:
        return supervisor.engine_restart(engine_id=engine_id, reason=reason).status
    except SupervisorError as exc:
        logger.warning("%s", exc)
        return f"failed: {exc}"


@shared_task(name="inference_ops.tasks.engine_check", soft_time_limit=60, time_limit=90)
def engine_check_task(engine_id: int) -> str | None:
    action = supervisor.engine_check(engine_id=engine_id)
    engine = EngineProcess.objects.filter(pk=engine_id).first()
    if engine is None:
        return action
    if action == "restart":
        engine_start_task.apply_async((engine_id, "automatic restart"), queue=engine.queue)
    elif action == "scheduled" and engine.next_restart_at:
        # Started when its backoff ends rather than at the first check after it. Should this task
        # be lost, that check still starts it; a start that finds one under way does nothing.
        engine_start_task.apply_async(
            (engine_id, "automatic restart"), queue=engine.queue, eta=engine.next_restart_at
        )
    return action


@shared_task(name="inference_ops.tasks.engines_check_all", soft_time_limit=30, time_limit=60)
def engines_check_all() -> int:
    """Beat, every few seconds: one check per engine that should run, or whose port another
    process holds (it is served again once that port is free), on the engine's own queue."""
    engines = EngineProcess.objects.filter(
        Q(desired_state=EngineProcess.Desired.RUNNING) | Q(status=EngineProcess.Status.PORT_TAKEN)
    ).only("pk", "host")
    for engine in engines:
        engine_check_task.apply_async((engine.pk,), queue=engine.queue, expires=30)
    return len(engines)


@shared_task(name="inference_ops.tasks.endpoints_check_all", soft_time_limit=30, time_limit=60)
def endpoints_check_all() -> int:
    """Beat: one check per endpoint that no engine row runs (a router, a vLLM run elsewhere). On
    the default queue: what must reach it is the web tier's network, not an engine host."""
    ids = list(
        ModelEndpoint.objects.filter(active=True)
        .exclude(kind=ModelEndpoint.Kind.EXTERNAL)
        .exclude(pk__in=EngineProcess.objects.values("endpoint_id"))
        .values_list("pk", flat=True)
    )
    for endpoint_id in ids:
        endpoint_check_task.apply_async(
            (endpoint_id,), queue="default", expires=settings.ENGINE_CHECK_INTERVAL
        )
    return len(ids)


@shared_task(name="inference_ops.tasks.endpoint_check", soft_time_limit=30, time_limit=60)
def endpoint_check_task(endpoint_id: int) -> str | None:
    return endpoint_checks.endpoint_check(endpoint_id=endpoint_id)


def engines_check_after_failure(endpoint_id: int) -> int:
    """A request just lost the connection to this endpoint: check its engines now, not at the
    next beat tick, so a crashed engine is noticed (and restarted) at once. Called from the web
    process; at most once per ENGINE_SUSPECT_SECONDS per endpoint across processes (a Redis key),
    so a burst of failing requests sends one check. Returns the checks sent."""
    key = f"{settings.REDIS_KEY_PREFIX}:engine:check-after-failure:{endpoint_id}"
    try:
        if not core_redis.client().set(
            key, 1, nx=True, ex=max(1, round(settings.ENGINE_SUSPECT_SECONDS))
        ):
            return 0
    except Exception:  # Redis down: the beat's checks still come
        logger.warning("cannot debounce an engine check; not sending one", exc_info=True)
        return 0
    engines = EngineProcess.objects.filter(
        endpoint_id=endpoint_id, desired_state=EngineProcess.Desired.RUNNING
    )
    sent = 0
    for engine in engines:
        engine_check_task.apply_async((engine.pk,), queue=engine.queue, expires=30)
        sent += 1
    return sent


@shared_task(name="inference_ops.tasks.adapter_load", soft_time_limit=60, time_limit=90)
def adapter_load_task(adapter_id: int) -> str:
    """Load a runtime adapter, on the engine's host; the row keeps the engine's answer."""
    return _adapter(adapter_id, lora.adapter_load, "loaded")


@shared_task(name="inference_ops.tasks.adapter_unload", soft_time_limit=60, time_limit=90)
def adapter_unload_task(adapter_id: int) -> str:
    return _adapter(adapter_id, lora.adapter_unload, "unloaded")


def _adapter(adapter_id: int, operation, done: str) -> str:
    adapter = LoraAdapter.objects.select_related("engine").filter(pk=adapter_id).first()
    if adapter is None:
        return "gone"
    try:
        operation(adapter=adapter)
    except SupervisorError as exc:
        logger.warning("%s", exc)
        return f"failed: {exc}"
    return done


def adapter_enqueue(action: str, adapter: LoraAdapter) -> None:
    """Send load/unload to the adapter's engine host (used by the admin, after commit): the call
    to the engine is made where the engine runs, not in the web request."""
    task = {"load": adapter_load_task, "unload": adapter_unload_task}[action]
    task.apply_async((adapter.pk,), queue=adapter.engine.queue)


def enqueue(action: str, engine: EngineProcess, reason: str | None = None) -> None:
    """Send start/stop/restart to the engine's host (used by the admin, after commit)."""
    task = {"start": engine_start_task, "stop": engine_stop_task, "restart": engine_restart_task}[
        action
    ]
    args = (engine.pk,) if reason is None else (engine.pk, reason)
    task.apply_async(args, queue=engine.queue)
