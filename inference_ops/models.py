"""Model endpoints: every OpenAI-compatible target the gateway can send a question to."""

import logging
import os

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from core.key_env import key_env_problem
from inference_ops import policy
from inference_ops.engine_keys import derived_key
from privacy.detector import TYPES as PERSONAL_DATA_TYPES

logger = logging.getLogger(__name__)


def default_apis() -> list[str]:
    """What an endpoint serves unless told otherwise: a generative model's two APIs."""
    return [ModelEndpoint.Api.CHAT, ModelEndpoint.Api.COMPLETIONS]


class ModelEndpoint(models.Model):
    class Kind(models.TextChoices):
        VLLM = "vllm", "vLLM server"
        CPU = "cpu", "CPU engine (llama.cpp server)"
        EXTERNAL = "external", "External OpenAI-compatible API"

    class Status(models.TextChoices):
        UNKNOWN = "unknown", "unknown"
        READY = "ready", "ready"
        UNHEALTHY = "unhealthy", "unhealthy"
        DOWN = "down", "down"

    class Api(models.TextChoices):
        """The /v1 APIs an endpoint answers: routing sends a request only where its API is
        served (a vLLM pooling model serves embeddings alone)."""

        CHAT = "chat", "chat completions"
        COMPLETIONS = "completions", "completions (a raw prompt)"
        EMBEDDINGS = "embeddings", "embeddings"

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    base_url = models.URLField(help_text="The /v1 URL, e.g. http://127.0.0.1:8001/v1")
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Name of the environment variable that holds the API key (it must start with "
        "GW_KEY_, or be listed by the operator). The key itself is never stored.",
    )
    model = models.CharField(max_length=200, help_text="Served model name sent as `model`.")
    apis = ArrayField(
        models.CharField(max_length=16, choices=Api.choices),
        default=default_apis,
        help_text="The /v1 APIs it serves. A vLLM server serves one runner: chat and completions "
        "(a generative model) or embeddings (a pooling model, `--runner pooling`).",
    )
    lora_adapter = models.CharField(
        max_length=200,
        blank=True,
        help_text="Send this LoRA adapter's name as `model` instead (vLLM).",
    )
    context_window = models.PositiveIntegerField(default=4096, validators=[MinValueValidator(256)])
    connect_timeout = models.FloatField(default=3.0, validators=[MinValueValidator(0.1)])
    first_token_timeout = models.FloatField(default=30.0, validators=[MinValueValidator(0.1)])
    idle_timeout = models.FloatField(
        default=15.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest pause between two tokens.",
    )
    total_timeout = models.FloatField(default=300.0, validators=[MinValueValidator(1)])
    max_concurrency = models.PositiveIntegerField(
        default=64, help_text="Requests in flight from one gateway process; more wait for a slot."
    )
    # Retries before the first token (routing.chain): a transient failure (5xx, reset,
    # refused, no headers in time, a 429) is tried again on this endpoint, after a backoff with
    # full jitter, before the chain's next target is.
    retries = models.PositiveSmallIntegerField(
        default=2,
        validators=[MaxValueValidator(10)],
        help_text="Tries again after a transient failure before the first token, before the next "
        "target of the chain. 0: straight to the next target.",
    )
    retry_base = models.FloatField(
        "retry backoff base",
        default=0.25,
        validators=[MinValueValidator(0.0), MaxValueValidator(60.0)],
        help_text="Seconds; the n-th retry waits a random time up to base × 2^(n-1), capped.",
    )
    accepts_prefill = models.BooleanField(
        "accepts prefill",
        default=False,
        help_text="Continues a partial assistant answer sent as the last message "
        "(continue_final_message, as vLLM does): an answer cut mid-stream elsewhere may be "
        "finished here. vLLM endpoints always do.",
    )
    personal_data = ArrayField(
        models.CharField(max_length=16, choices=[(kind, kind) for kind in PERSONAL_DATA_TYPES]),
        default=list,
        blank=True,
        help_text="External endpoints: the personal data it may receive (privacy.detector's "
        "types). None by default: a question holding any other type never goes there, as a "
        "target or a fallback; it stays on the local road or is refused. Local endpoints "
        "receive every type.",
    )
    retry_cap = models.FloatField(
        "retry backoff cap",
        default=2.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(60.0)],
        help_text="Seconds: the longest backoff between two tries.",
    )
    capacity = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Requests in flight to this endpoint from all gateway processes together (e.g. the "
            "engine's max_num_seqs); more wait in the gateway, by priority class and fair share "
            "(inference_ops.admission). Blank: no shared admission, only the per-process limit."
        ),
    )
    extra_headers = models.JSONField(
        default=dict,
        blank=True,
        help_text='HTTP headers sent with every request, e.g. {"X-Title": "gateway"}.',
    )
    replica_group = models.SlugField(
        max_length=100,
        blank=True,
        help_text="Endpoints with the same group serve the same model: a rule's target naming any "
        "of them is answered by the least busy ready one (a conversation stays on its replica "
        "while loads are close).",
    )
    # Prices, in SPEND_CURRENCY (spend.prices): what the request log, the dashboard and the
    # budgets count. Empty: free.
    price_input = models.DecimalField(
        "price per 1M input tokens",
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
    )
    price_output = models.DecimalField(
        "price per 1M output tokens",
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
    )
    price_engine_second = models.DecimalField(
        "price per engine-second",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="For a local engine priced by its time: a request costs its seconds in the "
        "engine times this rate (with batching, the engine's hourly cost / 3600 divided by the "
        "requests it serves at once).",
    )
    active = models.BooleanField(default=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    status_reason = models.CharField(max_length=500, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    requests_running = models.FloatField(null=True, blank=True)
    requests_waiting = models.FloatField(null=True, blank=True)
    kv_cache_usage = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return self.name

    @property
    def road(self) -> str:
        """The road a request to this endpoint takes: local (our own engines) or external."""
        return "external" if self.kind == self.Kind.EXTERNAL else "local"

    @property
    def takes_personal_data(self) -> frozenset[str]:
        """The personal data types a question sent here may hold: every one on the local road."""
        return frozenset(PERSONAL_DATA_TYPES if self.road == "local" else self.personal_data)

    @property
    def continues_answers(self) -> bool:
        """Whether an answer cut elsewhere may be continued here (an assistant prefill)."""
        return self.kind == self.Kind.VLLM or self.accepts_prefill

    @property
    def request_model(self) -> str:
        return self.lora_adapter or self.model

    def clean(self):
        problems = {}
        if problem := key_env_problem(self.api_key_env):
            problems["api_key_env"] = problem
        if problem := self.apis_problem():
            problems["apis"] = problem
        if problems:
            raise ValidationError(problems)

    def apis_problem(self) -> str | None:
        """Why the APIs it says it serves cannot be, or None."""
        apis = list(self.apis or ())
        if not apis:
            return "Choose the APIs it serves: at least one."
        unknown = sorted(set(apis) - set(self.Api.values))
        if unknown:
            return f"Unknown API {', '.join(unknown)}; the APIs are {', '.join(self.Api.values)}."
        if len(set(apis)) != len(apis):
            return "Each API once."
        generative = {self.Api.CHAT, self.Api.COMPLETIONS} & set(apis)
        if self.kind == self.Kind.VLLM and self.Api.EMBEDDINGS in apis and generative:
            # vLLM 0.32 registers the routes of its runner only: a pooling model answers no
            # generation, a generative model no embeddings (404s the gateway would relay as
            # failures of the engine).
            return (
                "A vLLM server runs one runner: embeddings (a pooling model, --runner pooling) "
                "or chat and completions (a generative model), not both."
            )
        return None

    @property
    def api_key(self) -> str:
        if not self.api_key_env:
            # A local endpoint's engines started by our supervisor require this one
            # (inference_ops.engine_keys); an engine of someone else's without a key ignores it.
            return derived_key(self.pk) if self.pk and self.kind != self.Kind.EXTERNAL else ""
        # Checked again at use: a row written before the rule, or by the ORM, must not leak a
        # secret.
        if problem := key_env_problem(self.api_key_env):
            logger.error("endpoint %s: %s Sending no key.", self.name, problem)
            return ""
        return os.environ.get(self.api_key_env, "")


class EngineProcess(models.Model):
    """A model engine process the gateway starts, watches and restarts (vLLM, the simulator, the
    CPU engine)."""

    class Kind(models.TextChoices):
        VLLM = "vllm", "vLLM (vllm serve)"
        SIMULATOR = "simulator", "vLLM simulator (CPU, for tests and demos)"
        CPU = "cpu", "CPU engine (llama.cpp server)"

    class Desired(models.TextChoices):
        RUNNING = "running", "running"
        STOPPED = "stopped", "stopped"

    class Status(models.TextChoices):
        STOPPED = "stopped", "stopped"
        STARTING = "starting", "starting"
        READY = "ready", "ready"
        UNHEALTHY = "unhealthy", "unhealthy"
        CRASHED = "crashed", "crashed"
        RESTARTING = "restarting", "restarting (waiting for its backoff)"
        PORT_TAKEN = "port_taken", "not started: its port is held by another process"

    name = models.SlugField(max_length=100, unique=True)
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="engines")
    host = models.CharField(
        max_length=200,
        blank=True,
        help_text="Host that runs it; its worker consumes the queue ops.<host>. "
        "Empty: the `ops` queue.",
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.VLLM)
    model = models.CharField(
        max_length=300, help_text="Model id or path, e.g. Qwen/Qwen3-8B or /models/qwen3."
    )
    served_model_name = models.CharField(max_length=200, blank=True)
    bind_host = models.CharField(max_length=100, default="127.0.0.1")
    port = models.PositiveIntegerField()
    # vLLM's options; empty means vLLM's own default.
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    gpu_memory_utilization = models.FloatField(null=True, blank=True)
    max_num_seqs = models.PositiveIntegerField(null=True, blank=True)
    enable_lora = models.BooleanField(default=False)
    max_loras = models.PositiveIntegerField(null=True, blank=True)
    max_lora_rank = models.PositiveIntegerField(null=True, blank=True)
    tensor_parallel_size = models.PositiveIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=50, blank=True)
    dtype = models.CharField(max_length=20, blank=True)
    enable_prefix_caching = models.BooleanField(
        default=True,
        help_text="vLLM's automatic prefix caching (its default): a prompt that starts as an "
        "earlier one did reuses that start's KV cache blocks (the gateway lays its prompts out "
        "for it). Off starts vLLM with --no-enable-prefix-caching.",
    )
    tool_call_parser = models.CharField(
        max_length=50,
        blank=True,
        help_text="vLLM's tool-call parser for this model (hermes, llama3_json, mistral, …): the "
        "engine starts with --enable-auto-tool-choice --tool-call-parser NAME, so clients' tools "
        "work with tool_choice auto, required or a named function. Empty: the engine refuses "
        "those (tool_choice none still works).",
    )
    runtime_lora_updating = models.BooleanField(
        default=False,
        help_text="Allow loading and unloading adapters at run time "
        "(VLLM_ALLOW_RUNTIME_LORA_UPDATING): the adapters of this row, sent by the gateway, "
        "whose key the engine requires.",
    )
    extra_args = models.JSONField(
        default=list,
        blank=True,
        help_text='More arguments, e.g. ["--seed", "1"]; only flags allowed for the kind '
        "(inference_ops/policy.py).",
    )
    environment = models.JSONField(
        default=dict,
        blank=True,
        help_text='Extra environment, e.g. {"HF_HOME": "/data", "OMP_NUM_THREADS": "8"}; only '
        "engine variables allowed by exact name (inference_ops/policy.py: CUDA_VISIBLE_DEVICES, "
        "HF_HOME, VLLM_CPU_KVCACHE_SPACE, NCCL_DEBUG, OMP_NUM_THREADS, …), never one that loads "
        "code or names host files (LD_*, PATH, PYTHON*, CUDA_INJECTION64_PATH, OMP_TOOL_LIBRARIES, "
        "TRITON_CACHE_MANAGER, VLLM_SERVER_DEV_MODE, …). The engine never sees the gateway's own "
        "environment, and gets its API key from the supervisor.",
    )
    startup_timeout = models.PositiveIntegerField(
        default=900, help_text="Seconds to become ready (vLLM loads weights)."
    )
    stop_timeout = models.PositiveIntegerField(
        default=30, help_text="Seconds between SIGTERM and SIGKILL."
    )

    desired_state = models.CharField(
        max_length=16, choices=Desired.choices, default=Desired.STOPPED
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STOPPED)
    status_reason = models.CharField(max_length=1000, blank=True)
    status_changed_at = models.DateTimeField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Automatic restarts: exponential backoff, and a budget per window.
    restarts_in_window = models.PositiveIntegerField(default=0)
    restart_window_started_at = models.DateTimeField(null=True, blank=True)
    next_restart_at = models.DateTimeField(null=True, blank=True)
    # Set when the budget is spent: the engine stays down for an operator, whatever the window.
    restart_budget_spent = models.BooleanField(default=False)
    failed_checks = models.PositiveIntegerField(default=0)
    last_check_at = models.DateTimeField(null=True, blank=True)
    last_check_ok = models.BooleanField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "port"], name="engine_unique_host_port")
        ]

    def __str__(self):
        return self.name

    def clean(self):
        if problems := policy.engine_problems(self):
            raise ValidationError(problems)

    @property
    def queue(self) -> str:
        return f"ops.{self.host}" if self.host else "ops"

    @property
    def api_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def base_url(self) -> str:
        # A comparison, not a bind: a wildcard bind host is reached on loopback.
        host = "127.0.0.1" if self.bind_host in ("0.0.0.0", "::", "") else self.bind_host  # noqa: S104
        return f"http://{host}:{self.port}"


class EngineEvent(models.Model):  # noqa: DJ008 - listed by its fields under its engine
    """The history of an engine's states, with reasons: what an operator reads after an incident."""

    engine = models.ForeignKey(EngineProcess, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=16, choices=EngineProcess.Status.choices)
    reason = models.CharField(max_length=1000, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]


class LoraAdapter(models.Model):
    class State(models.TextChoices):
        STATIC = "static", "on the command line"
        LOADED = "loaded", "loaded at run time"
        UNLOADED = "unloaded", "not loaded"
        ERROR = "error", "error"

    engine = models.ForeignKey(EngineProcess, on_delete=models.CASCADE, related_name="adapters")
    name = models.SlugField(max_length=100)
    path = models.CharField(max_length=500)
    base_model = models.CharField(max_length=200, blank=True)
    static = models.BooleanField(
        default=True, help_text="Pass it with --lora-modules at start; else load at run time."
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNLOADED)
    error = models.CharField(max_length=1000, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["engine", "name"], name="adapter_unique_name")
        ]

    def __str__(self):
        return self.name

    def clean(self):
        if problems := policy.adapter_problems(self):
            raise ValidationError(problems)
