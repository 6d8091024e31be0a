"""The routes that generate nothing: /health and /ping, /version, /v1/models, /metrics and
/tokenize."""

import uuid

from aiohttp import web

from . import messages, tokenizer
from .config import VLLM_VERSION
from .http_json import json_body, json_response
from .protocol import validation_error
from .state import SIM, Simulator


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return json_response({"version": VLLM_VERSION})


async def models(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    cards = [
        _model_card(sim, name, root=sim.config.model, parent=None)
        for name in (*sim.served_names, *sim.fault_models)
    ]
    for lora in sim.loras.values():
        parent = (
            lora.base_model_name
            if lora.base_model_name in sim.served_names
            else sim.served_names[0]
        )
        cards.append(_model_card(sim, lora.name, root=lora.path, parent=parent))
    return json_response({"object": "list", "data": cards})


def _model_card(sim: Simulator, name: str, *, root: str, parent: str | None) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": sim.created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        # vLLM only states the context window on base models.
        "max_model_len": sim.config.max_model_len if parent is None else None,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": sim.created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


async def metrics_text(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body = sim.metrics.render(sim.engine.state()).encode()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def tokenize(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    body = json_body(request, await request.read())
    if not isinstance(body, dict):
        raise validation_error("body", "Input should be a valid dictionary", "dict_type")
    sim.resolve_model(body.get("model"))
    if isinstance(body.get("messages"), list):
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        tokens = messages.render(
            body["messages"],
            tools,
            add_generation_prompt=body.get("add_generation_prompt") is not False,
            continue_final=body.get("continue_final_message") is True,
        ).tokens
    elif isinstance(body.get("prompt"), str):
        tokens = tokenizer.tokenize(body["prompt"])
    else:
        raise validation_error("prompt", "Field required", "missing")
    return json_response(
        {
            "count": len(tokens),
            "max_model_len": sim.config.max_model_len,
            "tokens": tokenizer.token_ids(tokens),
            "token_strs": tokens if body.get("return_token_strs") else None,
        }
    )
