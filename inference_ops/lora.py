"""LoRA adapters loaded into and unloaded from a running vLLM at run time
(/v1/load_lora_adapter, /v1/unload_lora_adapter), and loaded again after a restart. Static
adapters come with the command line (inference_ops.engine_command).

Runs on the engine's host (its queue's worker), where `engine.base_url` reaches it.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from inference_ops import engine_keys
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineProcess, LoraAdapter

logger = logging.getLogger(__name__)


def _post(engine: EngineProcess, path: str, body: dict, timeout: float = 30.0) -> tuple[int, str]:
    # With the engine's key: its adapter routes load from whatever path they are sent, so only the
    # gateway, with the rows' paths, may call them (inference_ops.engine_keys).
    request = urllib.request.Request(  # noqa: S310 - the engine's own http:// base_url
        f"{engine.base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **engine_keys.auth_headers(engine)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the engine's own http:// base_url
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
    """Why the row's engine cannot load adapters at run time, or None: checked before anything is
    sent."""
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
            engine,
            "/v1/load_lora_adapter",
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
        status, body = _post(engine, "/v1/unload_lora_adapter", {"lora_name": adapter.name})
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
    """After a (re)start, load the runtime adapters that were loaded before; static ones come with
    argv."""
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
