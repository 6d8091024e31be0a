"""Model endpoints: every OpenAI-compatible target the gateway can send a question to."""

import os

from django.core.validators import MinValueValidator
from django.db import models


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

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    base_url = models.URLField(help_text="The /v1 URL, e.g. http://127.0.0.1:8001/v1")
    api_key_env = models.CharField(
        max_length=100, blank=True,
        help_text="Name of the environment variable that holds the API key. The key itself is never stored.",
    )
    model = models.CharField(max_length=200, help_text="Served model name sent as `model`.")
    lora_adapter = models.CharField(
        max_length=200, blank=True, help_text="Send this LoRA adapter's name as `model` instead (vLLM)."
    )
    context_window = models.PositiveIntegerField(default=4096, validators=[MinValueValidator(256)])
    connect_timeout = models.FloatField(default=3.0, validators=[MinValueValidator(0.1)])
    first_token_timeout = models.FloatField(default=30.0, validators=[MinValueValidator(0.1)])
    idle_timeout = models.FloatField(
        default=15.0, validators=[MinValueValidator(0.1)], help_text="Longest pause between two tokens."
    )
    total_timeout = models.FloatField(default=300.0, validators=[MinValueValidator(1)])
    max_concurrency = models.PositiveIntegerField(
        default=64, help_text="Requests in flight from one gateway process; more wait for a slot."
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
    def request_model(self) -> str:
        return self.lora_adapter or self.model

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""
