"""A CPU-only simulator of vLLM's OpenAI-compatible server.

Start it like vLLM:

    python -m inference_ops.simulator serve MODEL --port 8000 [vLLM flags] [simulator flags]
    python -m inference_ops.simulator --model MODEL ...

It serves vLLM's routes and JSON shapes (vLLM 0.32's): /health, /ping, /version, /v1/models,
/v1/chat/completions and /v1/completions (streamed or not), /tokenize,
/metrics (vLLM's Prometheus names), and /v1/load_lora_adapter and
/v1/unload_lora_adapter when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set. As in vLLM, a server
has its runner's routes only (the others are 404s): a cross-encoder (--cross-encoder,
--convert classify, or a model named like a reranker) serves /rerank, /v1/rerank,
/v2/rerank, /score and /v1/score instead of generation (scoring.py); an embedding model
(--runner pooling, --convert embed or --embedding-dim) serves /v1/embeddings (texts or token
ids, float or base64; no Matryoshka `dimensions`), and those routes too by cosine; a
generative model serves no embeddings. A completion's `echo` starts its text with the prompt;
`suffix` is refused as by a model without a FIM template.
A /rerank or /score request takes --time-to-first-token (one forward pass).
Tokens are paced by a continuous-batching scheduler (engine.py): every step of
--inter-token-latency gives each running sequence one token, at most
--max-num-seqs run at once, the rest wait. Admitted prompts go through a prefix
cache of --block-size token blocks (prefix_cache.py; --no-enable-prefix-caching
turns it off), which moves vllm:prefix_cache_queries_total and _hits_total.

The chat API goes beyond text as vLLM's does: messages of every shape (media parts count
placeholder tokens, messages.py), tools and tool_choice with --enable-auto-tool-choice and
--tool-call-parser (calls written and streamed as vLLM's Hermes parser does, tools.py),
response_format and structured_outputs (a value of the JSON schema, a choice, a regex match,
structured.py), logprobs (logprobs.py), n > 1, and usage.prompt_tokens_details with
--enable-prompt-tokens-details. Requests are validated with vLLM's 400s (errors.py).

As vLLM does, a chat with `continue_final_message: true` (and `add_generation_prompt` not true)
continues the last message, the assistant's partial answer: the answer is only the new tokens,
and the prefill counts as prompt. A seeded request plans its whole answer and writes what comes
after the prefill, so an answer cut and continued with the same seed reads as the uncut one.

Faults (faults.py, whose docstring is the grammar) come per request from the `X-Sim-Fail` header
(`500;times=1`, `mid-stream;after=5;how=close`, `flap;down=5;up=5`, ...), per model from
`--fault MODEL=SPEC` (MODEL is served too), or at random with --failure-injection-rate.
`python -m benchmarks.engine` measures the pacing under load. See `--help` for every flag.

A standalone process: no Django here, only asyncio and aiohttp.
"""
