"""OpenAI's chat completion request, field by field: which fields the gateway's policy owns, which
it passes on to every engine as the client sent them, and which only some kinds of engine take.

The gateway is a pass-through: what a client sends reaches the engine unchanged but for the fields
its policy owns (GATEWAY). A field an engine kind does not serve is never sent there to be ignored
in silence: a target of that kind is passed over, and a request that no target can take is refused
with a 400 naming the field (docs/architecture.md, "The /v1 fields").

The kinds are `ModelEndpoint.Kind`'s values: `vllm`, `cpu` (llama.cpp's server) and `external`
(any OpenAI-compatible API); and, for embeddings only, `kb`: the knowledge base's own embedding
model, run by the gateway.

The same holds for OpenAI's legacy completions (`/v1/completions`: COMPLETION_*) and embeddings
(`/v1/embeddings`: EMBEDDING_*), each with its own table below the chat request's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VLLM, CPU, EXTERNAL = "vllm", "cpu", "external"
ALL_KINDS = frozenset({VLLM, CPU, EXTERNAL})
KB = "kb"  # the knowledge base's embedding model, in the gateway's own process (embeddings only)

# The gateway's own: set or changed by its policy on the way to the engine.
GATEWAY = {
    "model": "the target's served name (or its LoRA adapter)",
    "messages": "passed on, after the rule's system prompt and with the KB passages beside the "
    "question; the oldest history trimmed to the target's context window",
    "max_tokens": "passed on under that name, never above the rule's ceiling",
    "max_completion_tokens": "passed on under that name, never above the rule's ceiling",
    "stream": "the engine always streams (with usage); the client gets what it asked for",
    "stream_options": "include_usage decides the client's usage chunk; the engine is always asked "
    "for usage",
}

# OpenAI's sampling and output fields that every kind of engine serves: passed on as sent.
EVERY = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "reasoning_effort",
    "metadata",
)

# OpenAI's own features that vLLM does not serve (it would drop them with a warning): sent to
# external targets only.
EXTERNAL_ONLY = (
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "service_tier",
    "store",
    "moderation",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "safety_identifier",
    "verbosity",
    "functions",
    "function_call",
)

# vLLM's own request fields (its sampling parameters and chat-template controls, as of vLLM 0.32's
# ChatCompletionRequest): vLLM targets only. The three llama.cpp's server reads under the same
# name and meaning go to it too.
VLLM_ONLY = (
    "use_beam_search",
    "length_penalty",
    "repetition_penalty",
    "repetition_detection",
    "watermarking",
    "stop_token_ids",
    "include_stop_str_in_output",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "truncation_side",
    "logprob_token_ids",
    "allowed_token_ids",
    "bad_words",
    "echo",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "chat_template_kwargs",
    "media_io_kwargs",
    "mm_processor_kwargs",
    "structured_outputs",
    "thinking_token_budget",
    "include_reasoning",
    "return_tokens_as_token_ids",
    "routed_experts_prompt_start",
    "session_id",
    "stream_interval",
    "cache_salt",
)
LOCAL_SAMPLING = ("top_k", "min_p", "ignore_eos")

# Fields a client may not set, and why: each is the operator's or the gateway's, or asks for
# something the gateway does not carry.
REFUSED = {
    "priority": "the gateway's admission policy sets the engine's priority",
    "request_id": "the gateway names each request itself",
    "chat_template": "a chat template is the engine operator's, not a request's",
    "vllm_xargs": "custom engine arguments are the engine operator's",
    "kv_transfer_params": "disaggregated-prefill transfers are the engines' own business",
    "ec_transfer_params": "disaggregated-prefill transfers are the engines' own business",
    "return_token_ids": "the prompt's tokens are the gateway's (they hold the rule's system prompt "
    "and knowledge-base passages), not the client's",
    "return_prompt_text": "the rendered prompt is the gateway's (it holds the rule's system prompt "
    "and knowledge-base passages), not the client's",
    "prompt_logprobs": "the prompt's logprobs would show the gateway's prompt (the rule's system "
    "prompt and knowledge-base passages)",
    "return_token_offsets": "it serves vLLM's render endpoints, which the gateway does not serve",
    "mm_payload": "it serves vLLM's render endpoints, which the gateway does not serve",
    "return_mm_kwargs": "it serves vLLM's render endpoints, which the gateway does not serve",
    "logits_processors": "logits processors load code on the engine",
    "guided_json": 'vLLM replaced it with `structured_outputs` ({"json": schema})',
    "guided_regex": 'vLLM replaced it with `structured_outputs` ({"regex": pattern})',
    "guided_choice": 'vLLM replaced it with `structured_outputs` ({"choice": [...]})',
    "guided_grammar": 'vLLM replaced it with `structured_outputs` ({"grammar": ...})',
    "guided_decoding_backend": "the engine operator chooses the structured-output backend",
    "structural_tag": 'vLLM takes it as `response_format` {"type": "structural_tag"}',
}

_TAKES: dict[str, frozenset[str]] = {
    **{name: ALL_KINDS for name in EVERY},
    **{name: frozenset({EXTERNAL}) for name in EXTERNAL_ONLY},
    **{name: frozenset({VLLM}) for name in VLLM_ONLY},
    **{name: frozenset({VLLM, CPU}) for name in LOCAL_SAMPLING},
}

KNOWN = frozenset(GATEWAY) | frozenset(_TAKES) | frozenset(REFUSED)

# Values that ask nothing of an engine: the field's default, or text-only output.
_NEUTRAL = {
    "store": (False, None),
    "modalities": (["text"], None),
    "parallel_tool_calls": (True, False, None),
}

KIND_NAMES = {
    VLLM: "vLLM",
    CPU: "llama.cpp",
    EXTERNAL: "external API",
    KB: "the knowledge base's embedding model",
}


@dataclass(frozen=True)
class Table:
    """One API's policy: the kinds of engine each field goes to, and the values of a field that
    ask nothing of an engine (so go anywhere)."""

    takes: Mapping[str, frozenset[str]]
    neutral: Mapping[str, tuple]


CHAT = Table(takes=_TAKES, neutral=_NEUTRAL)


def kinds_taking(name: str, value, table: Table = CHAT) -> frozenset[str]:
    """The engine kinds a request field may go to with this value."""
    if value is None or value in table.neutral.get(name, ()):
        return ALL_KINDS
    return table.takes.get(name, ALL_KINDS)


def kinds_for(fields: Mapping[str, object], table: Table = CHAT) -> dict[str, frozenset[str]]:
    """The fields of a request that only some kinds of engine take, each with those kinds."""
    limited = {}
    for name, value in fields.items():
        kinds = kinds_taking(name, value, table)
        if kinds != ALL_KINDS:
            limited[name] = kinds
    return limited


def field_refused(fields: Mapping[str, frozenset[str]], kind: str) -> str | None:
    """The first field an engine of `kind` does not take, or None."""
    for name, kinds in fields.items():
        if kind not in kinds:
            return name
    return None


def refusal_for(name: str, kinds: frozenset[str], kind: str, endpoint: str) -> str:
    """Why a field (or a message part) cannot go to an endpoint of this kind, as a 400's
    message."""
    takes = sorted(KIND_NAMES[k] for k in kinds)
    return (
        f"`{name}` is served by {' and '.join(takes)} targets only; {endpoint} is a "
        f"{KIND_NAMES.get(kind, kind)} target."
    )


# --- /v1/completions: OpenAI's legacy completions (a raw prompt), and vLLM's own fields -----------

COMPLETION_GATEWAY = {
    "model": "the target's served name (or its LoRA adapter)",
    "prompt": "passed on as sent: one string (or a list of one), or token ids; no system prompt, "
    "no knowledge-base passages",
    "max_tokens": "passed on, never above the rule's ceiling (the rule's default when none is "
    "sent)",
    "stream": "the engine always streams (with usage); the client gets what it asked for",
    "stream_options": "include_usage decides the client's usage chunk; the engine is always asked "
    "for usage",
}
COMPLETION_EVERY = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "user",
)
# llama.cpp's server refuses these in a completion (one choice, no echo, no suffix): vLLM and
# external APIs only, but for their neutral values.
COMPLETION_NOT_CPU = ("n", "echo", "suffix")
COMPLETION_EXTERNAL_ONLY = ("best_of",)
COMPLETION_VLLM_ONLY = (
    "use_beam_search",
    "length_penalty",
    "repetition_penalty",
    "repetition_detection",
    "watermarking",
    "stop_token_ids",
    "include_stop_str_in_output",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "truncation_side",
    "allowed_token_ids",
    "prompt_logprobs",
    "logprob_token_ids",
    "bad_words",
    "add_special_tokens",
    "response_format",
    "structured_outputs",
    "session_id",
    "return_tokens_as_token_ids",
    "return_token_ids",
    "routed_experts_prompt_start",
    "thinking_token_budget",
    "stream_interval",
    "cache_salt",
)
# The prompt is the client's own here (no system prompt, no passages): what chat refuses for
# showing the gateway's prompt (return_token_ids, prompt_logprobs) is the client's to ask.
COMPLETION_REFUSED = {
    name: REFUSED[name]
    for name in (
        "priority",
        "request_id",
        "vllm_xargs",
        "kv_transfer_params",
        "ec_transfer_params",
        "return_token_offsets",
        "mm_payload",
        "return_mm_kwargs",
        "logits_processors",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
    )
} | {
    "prompt_embeds": "prompt embeddings are tensors the engine loads, which the gateway does not "
    "carry",
}
COMPLETION_TAKES: dict[str, frozenset[str]] = {
    **{name: ALL_KINDS for name in COMPLETION_EVERY},
    **{name: frozenset({VLLM, EXTERNAL}) for name in COMPLETION_NOT_CPU},
    **{name: frozenset({EXTERNAL}) for name in COMPLETION_EXTERNAL_ONLY},
    **{name: frozenset({VLLM}) for name in COMPLETION_VLLM_ONLY},
    **{name: frozenset({VLLM, CPU}) for name in LOCAL_SAMPLING},
}
COMPLETION_KNOWN = (
    frozenset(COMPLETION_GATEWAY) | frozenset(COMPLETION_TAKES) | frozenset(COMPLETION_REFUSED)
)
COMPLETIONS = Table(
    takes=COMPLETION_TAKES,
    # One choice, no echo: what llama.cpp's server takes too.
    neutral={"n": (1,), "echo": (False,), "best_of": (1,)},
)


# --- /v1/embeddings -------------------------------------------------------------------------------

EMBEDDING_GATEWAY = {
    "model": "an endpoint that serves embeddings, or the knowledge base's model (`auto`)",
    "input": "passed on as sent: a string, a list of strings, or token ids (not to the knowledge "
    "base's model)",
    "encoding_format": "float or base64, passed on; the gateway encodes its own model's vectors",
}
EMBEDDING_EVERY = ("dimensions", "user")
EMBEDDING_VLLM_ONLY = (
    "truncate_prompt_tokens",
    "truncation_side",
    "add_special_tokens",
    "use_activation",
    "padding",
    "embed_dtype",
    "endianness",
    "cache_salt",
)
EMBEDDING_REFUSED = {
    "priority": REFUSED["priority"],
    "request_id": REFUSED["request_id"],
    "messages": "chat-shaped embedding input is not served: send the texts as `input`",
    "mm_processor_kwargs": "multimodal embedding input is not served: send the texts as `input`",
}
EMBEDDING_TAKES: dict[str, frozenset[str]] = {
    # `dimensions` is checked against the model (its own size, or a Matryoshka model's); `user`
    # names the caller, whom the gateway's own model knows already.
    **{name: ALL_KINDS | {KB} for name in EMBEDDING_EVERY},
    **{name: frozenset({VLLM}) for name in EMBEDDING_VLLM_ONLY},
}
EMBEDDING_KNOWN = (
    frozenset(EMBEDDING_GATEWAY) | frozenset(EMBEDDING_TAKES) | frozenset(EMBEDDING_REFUSED)
)
EMBEDDINGS = Table(takes=EMBEDDING_TAKES, neutral={})
