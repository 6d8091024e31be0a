"""The stack a benchmark starts for itself: a database of its own, the vLLM simulator, the gateway.

    with stack_session(drop=None if keep else name):
        with stack_run(name=name, sim_args=[...], gateway_extra={...}) as stack:
            ... stack.gateway.url, stack.simulator_url, stack.model ...

The database `name` lives on the configured server (created if missing, migrated), with
`make run`'s demo KB and routing and its `local` endpoint on this run's simulator, so
nothing of the developer's data changes. The gateway runs with production settings (see
servers.gateway_env) on that database, and with Redis keys of its own. Everything stops
when the blocks end, whatever happens inside them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from benchmarks import database, servers
from benchmarks.engines import engine_command, engine_run
from config import bootstrap
from devtools import embedded

MODEL = "bench/model"
# Clients' tools served, as by make run's engine row (inference_ops/demo.py; for the real vLLM,
# engines.bundled_vllm_fields). A request without tools is served the same either way.
SIMULATOR_TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


class StackError(Exception):
    """The stack could not start; the message carries the failing process's log."""


def _interrupt(signum, frame):
    # SIGTERM takes the same road as Ctrl-C, so the `with` blocks stop daphne and the simulator.
    raise KeyboardInterrupt


@contextlib.contextmanager
def stack_session(
    *, drop: str | None = None, say: Callable[[str], None] = lambda text: None
) -> Iterator[None]:
    """Around a benchmark's whole run: SIGTERM as Ctrl-C, the embedded servers held, and the
    database `drop` (if named) dropped at the end."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    # manage.py's bootstrap has put the embedded server's URL in the environment by now.
    holder = bootstrap.uses_embedded("DATABASE_URL") or not os.environ.get("DATABASE_URL")
    if holder:
        # As a holder of the embedded servers, a test run that ends meanwhile does not stop
        # PostgreSQL under us. Then (re)start it in case one just did.
        embedded.hold()
        embedded.postgres_url()
    try:
        yield
    finally:
        try:
            if drop:
                database.database_drop(drop)
                say(f"dropped {drop}")
        finally:
            if holder:
                embedded.release()
            signal.signal(signal.SIGTERM, previous)


def database_prepare(*, name: str, pool_size: int = 4) -> bool:
    """Point this process at database `name` (created if missing) and migrate it; True if created.
    Must come before anything in this process connects (see database.database_use)."""
    created = database.database_use(name, pool_size=pool_size)
    call_command("migrate", verbosity=0, interactive=False)
    return created


def demo_setup(
    *, sim_url: str, model: str = MODEL, local_max_concurrency: int | None = None
) -> str | None:
    """`make run`'s demo KB and routing on the current database, its `local` endpoint on the
    simulator at `sim_url`. Returns the demo KB import's summary when it loaded (None: the KB
    had entries already).

    `local_max_concurrency` raises the endpoint's own cap on requests in flight per gateway
    process, so that a load above its default measures the gateway and not the cap.
    """
    from inference_ops import demo as engine_demo
    from inference_ops.models import ModelEndpoint
    from knowledge.demo import demo_kb_load
    from knowledge.services.vectors import embedding_model_ensure
    from routing.demo import demo_rules_ensure

    # What LOCAL_VLLM_URL and LOCAL_VLLM_MODEL do for seed_demo, for this run's simulator.
    settings.LOCAL_VLLM_URL, settings.LOCAL_VLLM_MODEL = f"{sim_url}/v1", model
    embedding_model_ensure()
    report = demo_kb_load()
    engine_demo.demo_engine_ensure()
    local = ModelEndpoint.objects.get(name="local")
    if local_max_concurrency is not None and local.max_concurrency < local_max_concurrency:
        ModelEndpoint.objects.filter(pk=local.pk).update(max_concurrency=local_max_concurrency)
        local.refresh_from_db()
    # No external endpoint: every answer comes from the simulator, none leaves the machine.
    demo_rules_ensure(local=local, external=None)
    return report.summary() if report is not None else None


@dataclass(frozen=True)
class Stack:
    database: str
    created: bool  # the database was created by this run (else: kept from an earlier one)
    simulator_url: str  # without /v1
    model: str  # the name the simulator serves
    gateway: servers.Gateway
    demo_kb: str | None  # the demo KB import's summary, when it loaded in this run
    local_max_concurrency: int  # the `local` endpoint's cap as the gateway reads it
    redis_prefix: str  # the gateway's REDIS_KEY_PREFIX (its cache keys, counters, breakers)

    @property
    def gateway_pid(self) -> int:
        return self.gateway.process.pid


@contextlib.contextmanager
def stack_run(
    *,
    name: str,
    sim_args: list[str],
    model: str = MODEL,
    gateway_extra: dict[str, str] | None = None,
    local_max_concurrency: int | None = None,
    web_concurrency: int | None = None,
    log_dir: Path | None = None,
    setup: Callable[[], None] | None = None,
    engine_fields: dict | None = None,
    engine_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """Database `name` prepared, the simulator with `sim_args` (and tool calls served, as by make
    run's engine), the demo data, then the gateway with `gateway_extra` added to its environment
    (ROUTING_DEFAULT_MAX_TOKENS, CHAT_RATE_LIMIT, ...). `setup` runs after the demo data, before
    the gateway starts (rows the gateway must find).

    `engine_fields`: instead of the simulator, the engine an engine row with these fields runs (the
    real vLLM: benchmarks.engines.bundled_vllm_fields), started from the row's own argv; `model` is
    then the name it serves. `engine_env` adds to its environment what no row may set (a bench's
    VLLM_SERVER_DEV_MODE, for /reset_prefix_cache between measurements; the engine listens on
    the loopback only).

    `web_concurrency`: the gateway through config.web with that many daphne processes (None:
    one daphne, started directly). Logs go to `log_dir`, else to a directory removed at the end.
    Raises StackError, with the log's tail, when a process does not start.
    """
    from inference_ops.models import ModelEndpoint

    created = database_prepare(name=name)
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{name}_")))
        else:
            log_dir.mkdir(parents=True, exist_ok=True)
        try:
            if engine_fields is None:
                sim = stack.enter_context(
                    servers.simulator(
                        model=model,
                        args=[*SIMULATOR_TOOL_ARGS, *sim_args],
                        log_path=log_dir / "simulator.log",
                    )
                )
            else:
                command = engine_command(fields=engine_fields)
                if engine_env:
                    command = replace(command, env={**command.env, **engine_env})
                running = stack.enter_context(
                    engine_run(
                        command=command,
                        log_path=log_dir / "engine.log",
                    )
                )
                sim, model = running.url, running.model
        except RuntimeError as exc:
            raise StackError(str(exc)) from None
        demo = demo_setup(sim_url=sim, model=model, local_max_concurrency=local_max_concurrency)
        if setup is not None:
            setup()
        prefix = f"gwbench{os.getpid()}"
        env = servers.gateway_env(
            database_url=database.database_url(name),
            redis_url=settings.REDIS_URL,
            secret_key=settings.SECRET_KEY,
            # Our own Redis keys: breakers, rate limits and the channel layer of the developer's
            # gateway, whose user and endpoint ids overlap ours, stay apart.
            REDIS_KEY_PREFIX=prefix,
            **(gateway_extra or {}),
        )
        gateway_log = log_dir / ("web.log" if web_concurrency else "daphne.log")
        try:
            gateway = stack.enter_context(
                servers.gateway(env=env, log_path=gateway_log, web_concurrency=web_concurrency)
            )
        except RuntimeError as exc:
            raise StackError(str(exc)) from None
        yield Stack(
            database=name,
            created=created,
            simulator_url=sim,
            model=model,
            gateway=gateway,
            demo_kb=demo,
            local_max_concurrency=ModelEndpoint.objects.get(name="local").max_concurrency,
            redis_prefix=prefix,
        )
