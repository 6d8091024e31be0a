"""What a configuration row may ask of the host it runs on.

Endpoint and engine rows are written in the admin, yet they reach the host: an endpoint's
`api_key_env` names a variable whose value leaves as a Bearer token for the row's URL, and an
engine row becomes a command line and an environment on the GPU host. So a row may only name
what is listed here (or added by the operator in settings, who owns the host anyway):

- an endpoint key comes from a variable named with ENDPOINT_KEY_ENV_PREFIX (`GW_KEY_`), or listed
  in ENDPOINT_KEY_ENV_NAMES, or the one EXTERNAL_LLM_API_KEY_ENV names; never a gateway secret;
- an engine starts from a clean environment (a few host variables and what the engines read),
  the row adds only allow-listed variables, never loader, shell or Python hooks;
- `extra_args` are flags allow-listed per engine kind: nothing that loads code (plugins,
  middleware, remote model code), serves or writes files, or rebinds the port;
- a flag that names a file or folder on the host (a chat template, the download folder, a
  tokenizer or generation config given as a path) names one inside ENGINE_FILES_DIR, or the
  project's bundled templates: the GPU host is another machine than the admin's, and its SSH
  keys or its environment must not become a template in a prompt;
- no value that lands on the command line may start with `-` and turn into a flag.

The checks run in the models' `clean()` (the admin shows them) and again in the supervisor
before a launch and in `ModelEndpoint.api_key`, for rows written before the rules or by the ORM.
The lists and their checks: environments in `policy_env`, flags and host paths in `policy_flags`;
here the checks of a whole row.
"""

from __future__ import annotations

import re

from inference_ops.policy_env import environment_problems
from inference_ops.policy_flags import extra_args_problems

NOT_A_FLAG = "must not start with '-' (it would be read as a command-line flag)"


def engine_problems(engine) -> dict[str, list[str]]:
    """Every reason the row may not be launched, by field; empty when it may."""
    problems: dict[str, list[str]] = {}
    for field in ("model", "served_model_name", "bind_host", "quantization", "dtype"):
        if str(getattr(engine, field) or "").startswith("-"):
            problems[field] = [NOT_A_FLAG]
    parser = getattr(engine, "tool_call_parser", "")
    if parser and not re.fullmatch(r"[a-z0-9_]{1,50}", parser):
        # A name of vLLM's own parsers; a plugin's module path would load code on the host.
        problems["tool_call_parser"] = ["a parser's name: lowercase letters, digits and _"]
    elif parser and engine.kind == "cpu":
        problems["tool_call_parser"] = [
            "llama.cpp's server reads tool calls through its chat template (--jinja); "
            "it has no parser to set"
        ]
    if found := extra_args_problems(engine.kind, engine.extra_args):
        problems["extra_args"] = found
    if found := environment_problems(engine.environment):
        problems["environment"] = found
    return problems


def adapter_problems(adapter) -> dict[str, list[str]]:
    return {
        field: [NOT_A_FLAG]
        for field in ("name", "path", "base_model")
        if str(getattr(adapter, field) or "").startswith("-")
    }


def problems_text(problems: dict[str, list[str]]) -> str:
    return "; ".join(
        f"{field}: {message}" for field, messages in problems.items() for message in messages
    )
