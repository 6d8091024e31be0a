"""What the simulated server holds while it runs: its engine and metrics, the LoRA adapters it
serves, the random streams of text and faults; and which served model a request names."""

import dataclasses
import hashlib
import random
import time

from aiohttp import web

from .config import VLLM_VERSION, LoraModule, SimConfig
from .engine import Engine
from .faults import Fault, FaultBook, parse_spec
from .metrics import Metrics
from .protocol import APIError


class Simulator:
    def __init__(self, config: SimConfig):
        self.config = config
        self.created = int(time.time())
        self.served_names = config.served_model_names or (config.model,)
        self.metrics = Metrics(config.primary_name)
        self.engine = Engine(
            max_num_seqs=config.max_num_seqs,
            priority_scheduling=config.scheduling_policy == "priority",
            max_model_len=config.max_model_len,
            ttft=config.ttft,
            itl=config.itl,
            metrics=self.metrics,
            max_loras=config.max_loras if config.enable_lora else None,
            block_size=config.block_size,
            prefix_caching=config.enable_prefix_caching,
        )
        self.loras: dict[str, LoraModule] = {m.name: m for m in config.lora_modules}
        # The models named by --fault are served too, each answering under its own name.
        # Counted per model: two models given the same SPEC each get its `times`.
        self.model_faults: dict[str, Fault] = {
            model: dataclasses.replace(parse_spec(spec), spec=f"{model}={spec}")
            for model, spec in config.faults
        }
        self.fault_models = tuple(m for m in self.model_faults if m not in self.served_names)
        self.faults = FaultBook()
        # Two streams from one seed, so injected faults do not shift generated text.
        self.text_rng = random.Random(config.seed)
        self.fault_rng = random.Random(None if config.seed is None else config.seed + 1)
        # vLLM's system_fingerprint: its version and a hash of its configuration.
        digest = hashlib.sha256(repr(config).encode()).hexdigest()[:8]
        self.fingerprint = f"vllm-{VLLM_VERSION}-{digest}"

    def resolve_model(self, name: str | None, *, pooling: bool = False) -> tuple[str, str | None]:
        """The model name to answer with, and the LoRA adapter to use."""
        if not name or name in self.served_names:
            # vLLM answers with the primary served name, whichever alias was asked for; a request
            # that names no model at all goes to the base model.
            return self.served_names[0], None
        if name in self.model_faults:
            return name, None
        if name in self.loras:
            return name, name
        message = f"The model `{name}` does not exist."
        if not pooling:
            # vLLM's check for generation and /tokenize names the base model's served names (never
            # the adapters); its pooling routes (embeddings, rerank, score) fail later, without
            # them.
            message += f" Valid aliases: {', '.join(self.served_names)}."
        raise APIError(message, err_type="NotFoundError", status=404, param="model")


# Where every route finds the simulator: `request.app[SIM]`.
SIM = web.AppKey("simulator", Simulator)
