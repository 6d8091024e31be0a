"""Loading and unloading LoRA adapters at runtime: /v1/load_lora_adapter and
/v1/unload_lora_adapter, which exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set."""

import logging

from aiohttp import web

from .config import LoraModule
from .http_json import json_body
from .protocol import APIError
from .state import SIM

logger = logging.getLogger("inference_ops.simulator")


async def load_lora_adapter(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body = json_body(request, await request.read())
    body = body if isinstance(body, dict) else {}
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
        raise APIError(
            "Both 'lora_name' and 'lora_path' must be provided.", err_type="InvalidUserInput"
        )
    if name in sim.loras and not body.get("load_inplace"):
        raise APIError(
            f"The lora adapter '{name}' has already been loaded. If you want to load the "
            "adapter in place, set 'load_inplace' to True.",
            err_type="InvalidUserInput",
        )
    if not sim.config.enable_lora:
        # vLLM passes the adapter to an engine that has no LoRA support: a 500.
        raise APIError(
            "LoRA is not enabled. Use --enable-lora to enable LoRA.",
            err_type="InternalServerError",
            status=500,
        )
    sim.loras[name] = LoraModule(name=name, path=path)
    logger.info("Loaded new LoRA adapter: name '%s', path '%s'", name, path)
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body = json_body(request, await request.read())
    name = body.get("lora_name") if isinstance(body, dict) else None
    if not name:
        raise APIError(
            "'lora_name' needs to be provided to unload a LoRA adapter.",
            err_type="InvalidUserInput",
        )
    if name not in sim.loras:
        raise APIError(
            f"The lora adapter '{name}' cannot be found.", err_type="NotFoundError", status=404
        )
    del sim.loras[name]
    logger.info("Removed LoRA adapter: name '%s'", name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
