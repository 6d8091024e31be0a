"""Command line: the `vllm serve` surface, plus the simulator's own knobs.

Both `serve MODEL [flags]` and `--model MODEL [flags]` work. vLLM flags the
simulator does not model (--gpu-memory-utilization, --dtype, ...) are accepted
and ignored, so a supervisor can launch the simulator with the exact command
line it would give vLLM.
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping

from .config import DEFAULT_EMBEDDING_DIM, DEFAULT_MODEL, LoraModule, SimConfig
from .faults import FAULTS, parse_spec
from .tools import STRICT_TOOL_CALLING_ENV, TOOL_PARSERS

logger = logging.getLogger(__name__)


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> SimConfig:
    environ = os.environ if environ is None else environ
    # vLLM's parser accepts --max_model_len as well as --max-model-len.
    argv = [_dashed(a) for a in argv]
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    # The model is the first word only (`vllm serve MODEL ...`). Taking a
    # positional anywhere else would take the value of an unknown flag
    # (`--dtype auto`) for the model.
    model_tag = argv.pop(0) if argv and not argv[0].startswith("-") else None

    parser = argparse.ArgumentParser(
        prog="python -m inference_ops.simulator",
        description="A CPU-only simulator of vLLM's OpenAI-compatible server.",
        epilog="Other vLLM flags (--dtype, --gpu-memory-utilization, ...) are accepted and "
        "ignored. Per request, the X-Sim-Fail header injects a fault (SPEC: "
        "<fault>[;key=value]..., every fault takes times=N): " + ", ".join(FAULTS) + ".",
        allow_abbrev=False,  # an unknown vLLM flag must never be read as an abbreviation of ours
    )
    parser.add_argument("--model", help="model name or path (also accepted as `serve MODEL`)")
    parser.add_argument(
        "--served-model-name", nargs="+", help="names the API accepts; the first is the primary"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=8000, help="0 picks a free port (printed in the ready line)"
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="sequences decoded together; more wait"
    )
    parser.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="the order waiting sequences run in: arrival, or each request's `priority` (lower "
        "first, then arrival)",
    )
    parser.add_argument(
        "--max-model-len", type=_token_count, default=4096, help="context window, e.g. 4096 or 4k"
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens per KV-cache block: the prefix cache's unit and kv_cache_usage_perc's "
        "(vLLM on CPU uses 128)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count prefix-cache hits in vllm:prefix_cache_hits_total "
        "(on by default, as in vLLM V1)",
    )
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument(
        "--max-loras", type=int, default=1, help="only reported in vllm:lora_requests_info"
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        type=_lora_module,
        default=[],
        help='name=path or {"name": ..., "path": ..., "base_model_name": ...}',
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="serve tool_choice auto (needs --tool-call-parser); with both, required and named "
        "choices too",
    )
    parser.add_argument(
        "--tool-call-parser",
        help="a vLLM tool parser name; tool calls are written and streamed as vLLM's hermes "
        "parser does, whichever is named",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details (prefix-cache hits as cached_tokens)",
    )
    parser.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="the most logprobs a request may ask for per token (-1: no limit)",
    )
    parser.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="require one of these keys (Bearer) under /v1, /v2, /inference and /cohere, as vLLM "
        "does; default: VLLM_API_KEY",
    )
    parser.add_argument("--time-to-first-token", type=float, default=50.0, help="milliseconds")
    parser.add_argument("--inter-token-latency", type=float, default=20.0, help="milliseconds")
    parser.add_argument(
        "--startup-duration", type=float, default=0.0, help="seconds before the port opens"
    )
    parser.add_argument(
        "--failure-injection-rate", type=float, default=0.0, help="0..1 of requests get a fault"
    )
    parser.add_argument(
        "--fault",
        action="append",
        type=_model_fault,
        default=[],
        metavar="MODEL=SPEC",
        help="serve MODEL too, every request naming it getting the fault SPEC (as X-Sim-Fail "
        "takes it, e.g. '500;times=1'); repeatable",
    )
    parser.add_argument(
        "--mode",
        choices=("echo", "random"),
        default="random",
        help="echo the last user message, or random words",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="makes generated text and injected faults repeatable"
    )
    parser.add_argument(
        "--runner",
        choices=("auto", "generate", "pooling", "draft"),
        default="auto",
        help="vLLM's runner: `pooling` serves an embedding model (or, by --convert classify or a "
        "reranker's name, a cross-encoder) and no generation",
    )
    parser.add_argument(
        "--convert",
        choices=("auto", "none", "embed", "classify"),
        default="auto",
        help="vLLM's conversion of a model to a pooling one: embed (an embedding model) or "
        "classify (a cross-encoder)",
    )
    parser.add_argument(
        "--embedding-dim",
        type=int,
        default=0,
        help="simulate a pooling (embedding) model of this size: serves /v1/embeddings and no "
        f"generation (0: {DEFAULT_EMBEDDING_DIM} for --runner pooling, else a generative model)",
    )
    parser.add_argument(
        "--cross-encoder",
        action="store_true",
        help="simulate a cross-encoder (reranker): serves /rerank and /score, not generation; "
        "on by itself for a model whose name contains 'rerank'",
    )
    args, unknown = parser.parse_known_args(argv)

    if args.max_num_seqs < 1:
        parser.error("--max-num-seqs must be at least 1")
    if args.max_model_len < 1:
        parser.error("--max-model-len must be at least 1")
    if args.block_size < 1:
        parser.error("--block-size must be at least 1")
    if min(args.time_to_first_token, args.inter_token_latency, args.startup_duration) < 0:
        parser.error("latencies and --startup-duration must not be negative")
    if not 0.0 <= args.failure_injection_rate <= 1.0:
        parser.error("--failure-injection-rate must be between 0 and 1")
    if args.embedding_dim < 0:
        parser.error("--embedding-dim must not be negative")
    if args.lora_modules and not args.enable_lora:
        # vLLM fails at startup too: loading the static adapters needs LoRA enabled.
        parser.error("--lora-modules requires --enable-lora")
    if args.cross_encoder and args.embedding_dim:
        parser.error("--cross-encoder and --embedding-dim are two kinds of model; pick one")
    # vLLM refuses both at startup (entrypoints/launchers/cli_args.py, parser/parser_manager.py).
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        parser.error("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_auto_tool_choice and args.tool_call_parser not in TOOL_PARSERS:
        parser.error(
            f"Error: --enable-auto-tool-choice requires tool_parser:'{args.tool_call_parser}' "
            "which has not been registered"
        )
    if args.max_logprobs < -1:
        parser.error("--max-logprobs must be -1 or more")

    pooling_asked = bool(args.embedding_dim or args.cross_encoder) or args.convert in (
        "embed",
        "classify",
    )
    if args.runner == "generate" and pooling_asked:
        parser.error(
            "--runner generate serves a generative model: --embedding-dim, --cross-encoder and "
            "--convert embed|classify are a pooling model's"
        )
    if args.convert == "embed" and args.cross_encoder:
        parser.error("--convert embed makes an embedding model, not a cross-encoder")

    model = args.model or model_tag or DEFAULT_MODEL
    # vLLM tells a cross-encoder by the architecture in its config.json (…ForSequenceClassification
    # with one label); the simulator has no weights to read, so `serve BAAI/bge-reranker-v2-m3`, the
    # command line vLLM is given, goes by the name.
    cross_encoder = (
        args.cross_encoder
        or args.convert == "classify"
        or ("rerank" in model.lower() and not args.embedding_dim and args.convert != "embed")
    )
    embedding_dim = args.embedding_dim
    if not embedding_dim and not cross_encoder and (args.runner == "pooling" or pooling_asked):
        embedding_dim = DEFAULT_EMBEDDING_DIM
    return SimConfig(
        model=model,
        served_model_names=tuple(args.served_model_name or ()),
        host=args.host,
        port=args.port,
        max_num_seqs=args.max_num_seqs,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        lora_modules=tuple(args.lora_modules),
        ttft=args.time_to_first_token / 1000,
        itl=args.inter_token_latency / 1000,
        startup_duration=args.startup_duration,
        failure_injection_rate=args.failure_injection_rate,
        mode=args.mode,
        seed=args.seed,
        embedding_dim=embedding_dim,
        cross_encoder=cross_encoder,
        # Read like vLLM's envs.py: only "1" or "true" switch the routes on.
        allow_runtime_lora_updating=environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")
        .strip()
        .lower()
        in ("1", "true"),
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        strict_tool_calling=environ.get(STRICT_TOOL_CALLING_ENV, "True").lower() in ("true", "1"),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        max_logprobs=args.max_logprobs,
        # vLLM's rule (serve/middleware/register.py): --api-key first, else VLLM_API_KEY.
        api_keys=tuple(k for k in (args.api_key or [environ.get("VLLM_API_KEY")]) if k),
        faults=tuple(args.fault),
        ignored_args=tuple(unknown),
    )


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value


def _token_count(value: str) -> int:
    # vLLM takes human-readable lengths: 4096, 4k, 32K, 1m.
    lowered = value.strip().lower()
    for suffix, factor in (("k", 1000), ("m", 1_000_000)):
        if lowered.endswith(suffix):
            if value.strip()[-1].isupper():
                factor = 1024 if suffix == "k" else 1024 * 1024
            return int(float(lowered[:-1]) * factor)
    return int(lowered)


def _model_fault(value: str) -> tuple[str, str]:
    model, sep, spec = value.partition("=")
    if not sep or not model.strip() or not spec.strip():
        raise argparse.ArgumentTypeError(f"invalid fault {value!r}: expected MODEL=SPEC")
    try:
        parse_spec(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid fault {value!r}: {exc}") from None
    return model.strip(), spec.strip()


def _lora_module(value: str) -> LoraModule:
    # Both of vLLM's forms: name=path, or a JSON object with name, path and base_model_name.
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
            return LoraModule(
                name=data["name"], path=data["path"], base_model_name=data.get("base_model_name")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"invalid LoRA module JSON {value!r}: {exc}") from None
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"invalid LoRA module {value!r}: expected name=path or JSON"
        )
    return LoraModule(name=name, path=path)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    # Imported here so that parsing (and --help) stays instant.
    from .server import run

    return run(config)
