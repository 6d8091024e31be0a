"""The key an engine we start requires, and that every caller of ours sends it.

Without one, whatever reaches an engine's port generates on the GPU and, with runtime LoRA
updating on, loads an adapter from any path it names. So each engine the supervisor starts
requires a key (vLLM and the simulator read VLLM_API_KEY, llama-server LLAMA_API_KEY: the
environment, not the command line that `ps` shows every user of the host), and the gateway's
calls, the supervisor's probes and the adapter loads send it.

The key is its endpoint's: the one its `api_key_env` names when it names one (the operator's own
secret, in the worker's and the web's environment alike), else one derived from SECRET_KEY and the
endpoint's id. The derived key is stored nowhere, the same in the worker that starts the engine
and in every web process that calls it, and different for each endpoint. Rotating SECRET_KEY
changes it: restart the engines with the web processes.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

_SALT = "inference_ops.engine_keys"

# The variable each kind of engine reads its key from.
KEY_VARIABLE = {"vllm": "VLLM_API_KEY", "simulator": "VLLM_API_KEY", "cpu": "LLAMA_API_KEY"}


def derived_key(endpoint_id: int) -> str:
    """The key of an endpoint that names no key variable: an HMAC of its id under SECRET_KEY."""
    return salted_hmac(_SALT, str(endpoint_id), algorithm="sha256").hexdigest()


def engine_key(engine) -> str:
    """The key `engine` is started with and called with: its endpoint's."""
    return engine.endpoint.api_key


def key_environment(engine) -> dict[str, str]:
    """What the engine's environment gets so that it requires its key (nothing without one)."""
    key = engine_key(engine)
    return {KEY_VARIABLE[engine.kind]: key} if key and engine.kind in KEY_VARIABLE else {}


def auth_headers(engine) -> dict[str, str]:
    """The header a call to the engine carries (its probes, its adapters' loads)."""
    key = engine_key(engine)
    return {"Authorization": f"Bearer {key}"} if key else {}
