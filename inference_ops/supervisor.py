"""Engine supervision: start (launch, wait for readiness), stop, restart, health checks and
automatic restarts, each state change recorded on the engine row and its endpoint.

Runs in Celery tasks on the engine's host (queue `ops` or `ops.<host>`) and in
`manage.py engine`. Concurrency is settled on the row (`select_for_update`), so
two start requests never launch two processes. Any exit of an engine counts as a
failure, even status 0: vLLM's API server can exit cleanly after its engine died.

What it builds on, one idea each: the command line (engine_command), the processes
(engine_processes), the HTTP probes (probes), the runtime LoRA adapters (lora) and the state
changes, recorded and told after commit (engine_transitions).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client import Counter

from inference_ops import admission, policy
from inference_ops.engine_processes import (
    describe,
    is_ours,
    kill_leftovers,
    launch,
    leftovers,
    log_tail,
    owner_gone,
    port_holder,
    port_in_use,
    process_alive,
    stop_leftovers,
    terminate_session,
)
from inference_ops.engine_transitions import transition
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.lora import adapters_reload
from inference_ops.models import EngineProcess, LoraAdapter, ModelEndpoint
from inference_ops.probes import probe

logger = logging.getLogger(__name__)
Status = EngineProcess.Status
# Counted by the worker that runs the checks; /metrics adds up every process's counts
# (config.metrics).
CHECKS = Counter(
    "gateway_engine_checks_total", "Engine health checks by result.", ["engine", "result"]
)
RESTARTS = Counter(
    "gateway_engine_restarts_total", "Automatic engine restarts scheduled.", ["engine"]
)


# --- start, stop, restart -------------------------------------------------------------------------


def engine_start(*, engine_id: int, reason: str = "started by an operator") -> EngineProcess:
    """Start the engine unless it runs or is being started; wait until it is ready.

    Before a launch, whatever an earlier run of this engine left (found by its tag: a `make run`
    killed outright, a worker gone) is stopped; a port then still taken is someone else's, and the
    row says whose (status `port_taken`: never routed to as this engine). Raises EngineStartRefused
    (port taken, unknown kind) and SupervisorError when the process exits or does not become ready
    in `startup_timeout`, or the engine is stopped meanwhile; the row says why.
    """
    with transaction.atomic():
        engine = (
            EngineProcess.objects.select_for_update().select_related("endpoint").get(pk=engine_id)
        )
        engine.desired_state = EngineProcess.Desired.RUNNING
        engine.save(update_fields=["desired_state"])
        # An engine whose owner is gone (a `make run` killed outright) is a leftover, not adopted:
        # nobody would stop it.
        running = is_ours(engine, engine.pid) and not owner_gone(engine.pid)
        if engine.status in (Status.READY, Status.UNHEALTHY) and running:
            return engine
        if engine.status == Status.STARTING and _start_in_progress(engine):
            return engine
        if is_ours(engine, engine.pid):
            # A leftover of a failed start or an unhealthy run: replace it, never run two.
            terminate_session(engine.pid, engine.stop_timeout)  # type: ignore[arg-type]  # is_ours: a pid
        elif engine.pid and process_alive(engine.pid):
            logger.warning(
                "engine %s: its recorded %s is not an engine of ours; left alone",
                engine.name,
                describe(engine.pid),
            )
        if left := leftovers(engine, engine.pid):
            stopped = stop_leftovers(engine, left)
            logger.warning(
                "engine %s: stopped what an earlier run left: %s", engine.name, "; ".join(stopped)
            )
        problems = policy.engine_problems(engine)
        refused = f"refused: {policy.problems_text(problems)}" if problems else ""
        if refused:
            # A row written past the admin's validation (the ORM, an old row): never launched.
            transition(
                engine,
                Status.STOPPED,
                refused,
                pid=None,
                desired_state=EngineProcess.Desired.STOPPED,
                next_restart_at=None,
            )
        else:
            transition(
                engine,
                Status.STARTING,
                reason,
                pid=None,
                started_at=timezone.now(),
                failed_checks=0,
                restart_budget_spent=False,
            )
    if refused:
        raise EngineStartRefused(f"{engine.name}: {refused}")

    if port_in_use(engine.bind_host, engine.port):
        why = f"{_port_held(engine)}; not started, and nothing is sent to that port as this engine"
        why += ". Stop that process (or give the engine another port), then start the engine"
        transition(
            engine, Status.PORT_TAKEN, why, pid=None, desired_state=EngineProcess.Desired.STOPPED
        )
        raise EngineStartRefused(f"{engine.name}: {why}")
    try:
        pid = launch(engine)
    except SupervisorError as exc:
        if _stopped_meanwhile(engine):  # the stop ended the launcher too: not a crash
            raise SupervisorError(
                f"{engine.name}: start cancelled: the engine was stopped"
            ) from exc
        transition(engine, Status.CRASHED, str(exc))
        raise
    # Conditional: a stop that came while the launch ran found no pid to stop; this one sees it.
    if not EngineProcess.objects.filter(
        pk=engine.pk, desired_state=EngineProcess.Desired.RUNNING
    ).update(pid=pid):
        terminate_session(pid, engine.stop_timeout)
        raise SupervisorError(f"{engine.name}: start cancelled: the engine was stopped")
    engine.pid = pid
    return _wait_ready(engine)


def _port_held(engine: EngineProcess) -> str:
    holder = describe(port_holder(engine.port))
    return f"port {engine.port} is held by a process the gateway did not start: {holder}"


def _start_in_progress(engine: EngineProcess) -> bool:
    if is_ours(engine, engine.pid) and not owner_gone(engine.pid):
        return True
    # Between the STARTING commit and the recorded pid another start is launching it.
    changed = engine.status_changed_at or timezone.now()
    return engine.pid is None and timezone.now() - changed < timedelta(seconds=60)


def _stopped_meanwhile(engine: EngineProcess) -> bool:
    desired = (
        EngineProcess.objects.filter(pk=engine.pk).values_list("desired_state", flat=True).first()
    )
    return desired != EngineProcess.Desired.RUNNING


def _wait_ready(engine: EngineProcess) -> EngineProcess:
    deadline = time.monotonic() + engine.startup_timeout
    reason = "not probed yet"
    while time.monotonic() < deadline:
        if _stopped_meanwhile(engine):
            # engine_stop (an operator, `make run` stopping) has written the row; a stop that
            # raced the launch may have missed the process, so it goes here too.
            terminate_session(engine.pid, engine.stop_timeout)  # type: ignore[arg-type]  # the launch wrote the pid
            raise SupervisorError(f"{engine.name}: start cancelled: the engine was stopped")
        if not process_alive(engine.pid):
            if _stopped_meanwhile(engine):  # stopped between the two looks: not a crash
                raise SupervisorError(f"{engine.name}: start cancelled: the engine was stopped")
            tail = log_tail(engine, 15)
            transition(
                engine, Status.CRASHED, f"exited during start-up. Log:\n{tail}"[-1000:], pid=None
            )
            raise SupervisorError(f"{engine.name} exited during start-up:\n{tail}")
        healthy, reason, metrics = probe(engine, timeout=2.0)
        if healthy:
            adapters_reload(engine=engine)
            return transition(
                engine,
                Status.READY,
                "ready",
                metrics=metrics,
                last_check_at=timezone.now(),
                last_check_ok=True,
            )
        time.sleep(0.25)
    terminate_session(engine.pid, engine.stop_timeout)  # type: ignore[arg-type]  # the launch wrote the pid
    transition(
        engine, Status.CRASHED, f"not ready within {engine.startup_timeout}s ({reason})", pid=None
    )
    raise SupervisorError(f"{engine.name} was not ready within {engine.startup_timeout}s: {reason}")


def engine_stop(
    *, engine_id: int, reason: str = "stopped by an operator", keep_adapters: bool = False
) -> EngineProcess:
    """SIGTERM the engine's whole session, wait, SIGKILL what is left. No orphan survives.
    `keep_adapters`: remember the runtime adapters as loaded, to load them again at the next
    start."""
    with transaction.atomic():
        engine = EngineProcess.objects.select_for_update().get(pk=engine_id)
        engine.desired_state = EngineProcess.Desired.STOPPED
        engine.save(update_fields=["desired_state"])
        pid = engine.pid
    if is_ours(engine, pid):
        terminate_session(pid, engine.stop_timeout)  # type: ignore[arg-type]  # is_ours: a pid
    # A start still under way may have launched it a moment ago, before its pid was recorded.
    if left := leftovers(engine, pid):
        stop_leftovers(engine, left)
    if not keep_adapters:
        LoraAdapter.objects.filter(
            engine=engine, static=False, state=LoraAdapter.State.LOADED
        ).update(state=LoraAdapter.State.UNLOADED)
    status = Status.STOPPED
    if port_in_use(engine.bind_host, engine.port):
        # Ours is gone, so whoever listens there is not this engine (a `port_taken` row stopped,
        # a stranger that took the port meanwhile): the row keeps saying so, and nothing is sent
        # to that port as this engine (engine_state), until the checks find the port free
        # (`_check_port_taken`) or a start does.
        status = Status.PORT_TAKEN
        reason = f"{reason}; {_port_held(engine)}: nothing is sent to that port as this engine"
    return transition(engine, status, reason, pid=None, next_restart_at=None, metrics={})


def engine_restart(*, engine_id: int, reason: str = "restarted by an operator") -> EngineProcess:
    """Stop, then start; an operator's restart also resets the automatic-restart budget."""
    engine_stop(engine_id=engine_id, reason=reason, keep_adapters=True)
    EngineProcess.objects.filter(pk=engine_id).update(
        restarts_in_window=0, restart_window_started_at=None
    )
    return engine_start(engine_id=engine_id, reason=reason)


# --- health checks and automatic restarts ---------------------------------------------------------


def engine_check(*, engine_id: int) -> str | None:
    """One health check. Returns "restart" when the caller should start the engine now, and
    "scheduled" when it should start it at the row's `next_restart_at`."""
    engine = EngineProcess.objects.select_related("endpoint").filter(pk=engine_id).first()
    if engine is not None and engine.status == Status.PORT_TAKEN:
        return _check_port_taken(engine)  # type: ignore[func-returns-value]  # None, as engine_check's end
    if engine is None or engine.desired_state != EngineProcess.Desired.RUNNING:
        return None
    now = timezone.now()
    if engine.status == Status.STARTING:
        return _check_starting(engine, now)
    if engine.status == Status.RESTARTING:
        return "restart" if engine.next_restart_at and now >= engine.next_restart_at else None
    if engine.status in (Status.CRASHED, Status.STOPPED):
        if engine.next_restart_at is None and not engine.restart_budget_spent:
            return _schedule_restart(engine, engine.status_reason or "not running")
        return None

    if not process_alive(engine.pid):
        CHECKS.labels(engine.name, "exited").inc()
        # The row forgets the pid next: what the dead engine left goes now.
        kill_leftovers(engine, engine.pid)
        return _schedule_restart(engine, "the process exited")
    healthy, reason, metrics = probe(engine)
    CHECKS.labels(engine.name, "healthy" if healthy else "unhealthy").inc()
    if healthy:
        transition(
            engine,
            Status.READY,
            "ready" if engine.status == Status.READY else "recovered",
            failed_checks=0,
            last_check_at=now,
            last_check_ok=True,
            metrics=metrics,
        )
        ModelEndpoint.objects.filter(pk=engine.endpoint_id).update(
            requests_running=metrics.get("running"),
            requests_waiting=metrics.get("waiting"),
            kv_cache_usage=metrics.get("kv_cache_usage"),
            checked_at=now,
        )
        if engine.endpoint.capacity:
            admission.engine_report(
                name=engine.endpoint.name, capacity=engine.endpoint.capacity, metrics=metrics
            )
        return None
    failed = engine.failed_checks + 1
    if failed >= settings.ENGINE_RESTART_UNHEALTHY_AFTER:
        if is_ours(engine, engine.pid):  # a pid the row kept across a reboot names a stranger
            terminate_session(engine.pid, engine.stop_timeout)  # type: ignore[arg-type]  # is_ours: a pid
        EngineProcess.objects.filter(pk=engine.pk).update(pid=None, failed_checks=failed)
        return _schedule_restart(engine, f"unhealthy for {failed} checks ({reason}); killed")
    status = Status.UNHEALTHY if failed >= settings.ENGINE_UNHEALTHY_AFTER else engine.status
    transition(
        engine,
        status,
        f"{failed} failed check(s): {reason}"
        if status == Status.UNHEALTHY
        else engine.status_reason,
        failed_checks=failed,
        last_check_at=now,
        last_check_ok=False,
    )
    return None


def _check_port_taken(engine: EngineProcess) -> None:
    """A row kept from its port by another process turns `stopped` once the port is free: it is
    routed to as a stopped engine is again, and a start may launch it there. Under the row's lock,
    so a start that has begun meanwhile (the row `starting`, its engine on the port soon) is left
    alone."""
    with transaction.atomic():
        row = EngineProcess.objects.select_for_update().filter(pk=engine.pk).first()
        if row is None or row.status != Status.PORT_TAKEN:
            return
        if port_in_use(row.bind_host, row.port):
            return
        transition(
            row,
            Status.STOPPED,
            f"port {row.port} is free again; the engine is stopped: start it to serve",
        )


def _check_starting(engine: EngineProcess, now) -> str | None:
    """A start task lost with its worker leaves the row `starting` with nobody waiting for it.
    Past the start's own deadline and a grace no start task can still be at work, so the check
    takes over: adopt the engine if it answers, else kill what is left and restart it."""
    since = engine.status_changed_at or engine.started_at or now
    if now - since <= timedelta(seconds=engine.startup_timeout + settings.ENGINE_START_GRACE):
        return None
    if not process_alive(engine.pid):
        return _schedule_restart(engine, "start-up never finished (its start task was lost)")
    healthy, reason, metrics = probe(engine)
    if healthy:
        adapters_reload(engine=engine)
        transition(
            engine,
            Status.READY,
            "ready (adopted by a health check: its start task was lost)",
            failed_checks=0,
            metrics=metrics,
            last_check_at=now,
            last_check_ok=True,
        )
        return None
    if is_ours(engine, engine.pid):
        terminate_session(engine.pid, engine.stop_timeout)  # type: ignore[arg-type]  # is_ours: a pid
    return _schedule_restart(engine, f"start-up never finished ({reason}); killed")


def _schedule_restart(engine: EngineProcess, reason: str) -> str | None:
    """Back off, then restart; returns "scheduled" (start at `next_restart_at`) or None (budget
    spent)."""
    now = timezone.now()
    window_start = engine.restart_window_started_at
    restarts = engine.restarts_in_window
    if window_start is None or now - window_start > timedelta(
        seconds=settings.ENGINE_RESTART_WINDOW
    ):
        window_start, restarts = now, 0
    budget = settings.ENGINE_RESTART_BUDGET
    if restarts >= budget:
        transition(
            engine,
            Status.CRASHED,
            f"{reason}; restart budget exhausted ({budget} in {settings.ENGINE_RESTART_WINDOW}s): "
            "restart it by hand",
            pid=None,
            next_restart_at=None,
            restart_budget_spent=True,
        )
        return None
    delay = min(settings.ENGINE_BACKOFF_BASE * (2**restarts), settings.ENGINE_BACKOFF_MAX)
    RESTARTS.labels(engine.name).inc()
    transition(
        engine,
        Status.RESTARTING,
        f"{reason}; automatic restart {restarts + 1}/{budget} in {delay:g}s",
        pid=None,
        restarts_in_window=restarts + 1,
        restart_window_started_at=window_start,
        next_restart_at=now + timedelta(seconds=delay),
    )
    return "scheduled"
