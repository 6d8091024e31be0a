"""The simulator's configuration types: what the command line (cli) parses and the server runs
with."""

from dataclasses import dataclass, field

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # vLLM's own default model
# The vectors of an embedding model started without --embedding-dim (`--runner pooling`): the
# size of the small sentence-transformers models.
DEFAULT_EMBEDDING_DIM = 384
VLLM_VERSION = "0.32.0+sim"  # the vLLM version whose API this simulates, marked as a simulator


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str | None = None


@dataclass(frozen=True)
class SimConfig:
    model: str = DEFAULT_MODEL
    served_model_names: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    max_num_seqs: int = 256
    # vLLM's --scheduling-policy: "fcfs", or "priority" (the waiting queue by request priority)
    scheduling_policy: str = "fcfs"
    max_model_len: int = 4096
    block_size: int = 16  # tokens per KV-cache block
    enable_prefix_caching: bool = True  # vLLM V1's default
    enable_lora: bool = False
    max_loras: int = 1
    lora_modules: tuple[LoraModule, ...] = ()
    ttft: float = 0.05  # seconds
    itl: float = 0.02  # seconds
    startup_duration: float = 0.0  # seconds
    failure_injection_rate: float = 0.0
    mode: str = "random"
    seed: int | None = None
    embedding_dim: int = 0
    cross_encoder: bool = False
    allow_runtime_lora_updating: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    strict_tool_calling: bool = True  # VLLM_ENFORCE_STRICT_TOOL_CALLING, on by default in vLLM
    enable_prompt_tokens_details: bool = False
    max_logprobs: int = 20
    # --api-key or VLLM_API_KEY: the keys one of which a request under /v1 (and vLLM's other
    # guarded prefixes) must carry as a Bearer token.
    api_keys: tuple[str, ...] = ()
    # --fault MODEL=SPEC: (model, spec) pairs; each model is served, and its requests get the
    # fault (faults.py).
    faults: tuple[tuple[str, str], ...] = ()
    ignored_args: tuple[str, ...] = field(default=())

    @property
    def tool_parser(self) -> str | None:
        """The tool parser requests get: vLLM builds one only with --enable-auto-tool-choice
        and --tool-call-parser both given."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    @property
    def pooling(self) -> bool:
        """A pooling model (vLLM's `--runner pooling`): an embedding model or a cross-encoder,
        serving no generation."""
        return bool(self.embedding_dim) or self.cross_encoder

    @property
    def primary_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model
