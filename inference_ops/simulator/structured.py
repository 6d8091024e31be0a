"""Structured outputs: `response_format` (text, json_object, json_schema) and vLLM's own
`structured_outputs` field ({"json": schema}, {"regex": ...}, {"choice": [...]}, {"grammar": ...},
{"json_object": true}), validated as vLLM 0.32 validates them, and the text the simulated model
writes under each.

vLLM 0.32 no longer reads the old `guided_json`, `guided_choice`, `guided_regex`,
`guided_grammar` fields: they are extra fields it ignores with a warning, and the output is not
constrained (entrypoints/serve/engine/protocol.py, _REMOVED_GUIDED_FIELDS). The simulator does
the same.

A grammar or a structural tag is accepted but not modelled: the output is unconstrained text.
"""

import json
import logging
import random
from dataclasses import dataclass
from typing import Any

from . import regex_sample
from .errors import validation_error, vllm_error
from .schema_instance import instance

logger = logging.getLogger("inference_ops.simulator")

REMOVED_GUIDED_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
)
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of _KINDS
    value: Any = None


class EngineInputError(Exception):
    """A request the engine refuses when it takes it in (vLLM's input processor): a 400 before a
    non-streamed answer, an error event after the 200 of a stream."""

    def __init__(self, error):
        super().__init__(error.message)
        self.error = error


def parse(body: dict, *, endpoint: str, tool_choice: Any = "none") -> Constraint | None:
    """The request's output constraint, or None; vLLM's 400s for malformed ones."""
    removed = [key for key in REMOVED_GUIDED_FIELDS if key in body]
    if removed:
        logger.warning(
            "Request contains the removed guided-decoding field(s) %s, which are ignored; output "
            "will NOT be constrained. Use `structured_outputs` (or `response_format`) instead.",
            removed,
        )
    structured = _structured_outputs(body.get("structured_outputs"), endpoint, tool_choice)
    response_format = body.get("response_format")
    if response_format is None:
        return _one(structured) if structured is not None else None
    kind, override = _response_format(response_format)
    if kind == "text":
        return _one(structured) if structured is not None else None
    # vLLM's structured_outputs_from_response_format: the format overrides one field of
    # structured_outputs (or makes it), and the result must still name exactly one constraint.
    merged = dict(structured or {})
    merged[kind] = override
    return _one(merged)


def generate(constraint: Constraint, *, rng: random.Random, text: str, echo: bool) -> str | None:
    """What the model writes under `constraint` (None: unconstrained text). `text` is what it
    would have said without one; echo mode picks deterministically, random mode with `rng`."""
    if constraint.kind == "json":
        schema = constraint.value
        if isinstance(schema, str):
            schema = json.loads(schema)  # check_for_engine let only valid JSON through
        return json.dumps(instance(schema, text=text), ensure_ascii=False)
    if constraint.kind == "json_object":
        return json.dumps({"answer": text}, ensure_ascii=False)
    if constraint.kind == "choice":
        choices = constraint.value
        if echo:
            return text if text in choices else choices[0]
        return rng.choice(choices)
    if constraint.kind == "regex":
        return regex_sample.sample(constraint.value)
    return None


def check_for_engine(constraint: Constraint | None) -> None:
    """What vLLM's engine refuses when it takes the request in: a regex xgrammar cannot compile
    (its message is xgrammar's own; this one only looks like it), a JSON schema given as a
    string that does not parse."""
    if constraint is None:
        return
    if constraint.kind == "regex":
        try:
            regex_sample.sample(constraint.value)
        except ValueError as exc:
            raise EngineInputError(
                vllm_error(
                    f'Grammar error: invalid regex "{constraint.value}" (in regex): regex parse '
                    f"error: {exc}"
                )
            ) from None
    if constraint.kind == "json" and isinstance(constraint.value, str):
        try:
            json.loads(constraint.value)
        except ValueError:
            raise EngineInputError(vllm_error("Invalid JSON grammar specification.")) from None


def _structured_outputs(value, endpoint: str, tool_choice) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise validation_error(
            "structured_outputs",
            "Input should be a dictionary or an instance of StructuredOutputsParams",
            "dataclass_type",
            value,
        )
    # The request models' check_structured_outputs_count runs first, on the raw dict (only the
    # completions one names the parameter).
    if sum(value.get(key) is not None for key in ("json", "regex", "choice")) > 1:
        raise vllm_error(
            "You can only use one kind of constraints for structured outputs "
            "('json', 'regex' or 'choice').",
            parameter="structured_outputs" if endpoint == "completion" else None,
        )
    if (
        endpoint == "chat"
        and any(value.get(key) is not None for key in ("json", "regex", "choice"))
        and tool_choice not in ("none", "auto", "required")
    ):
        raise vllm_error(
            "You can only either use constraints for structured outputs or tools, not both."
        )
    checks = {
        "regex": (str, "string_type", "Input should be a valid string"),
        "grammar": (str, "string_type", "Input should be a valid string"),
        "structural_tag": (str, "string_type", "Input should be a valid string"),
        "json_object": (bool, "bool_type", "Input should be a valid boolean"),
        "json": ((str, dict), "dict_type", "Input should be a valid dictionary"),
        "choice": (list, "list_type", "Input should be a valid list"),
    }
    for key, (types, kind, message) in checks.items():
        field = value.get(key)
        if field is not None and not isinstance(field, types):  # type: ignore[arg-type]  # a class or a tuple of them
            raise validation_error(f"structured_outputs.{key}", message, kind, field)
    choice = value.get("choice")
    if choice is not None and not all(isinstance(c, str) for c in choice):
        raise validation_error(
            "structured_outputs.choice", "Input should be a valid string", "string_type", choice
        )
    return {key: value.get(key) for key in _KINDS if value.get(key) is not None} | {
        "_options": {k: v for k, v in value.items() if k not in _KINDS}
    }


def _response_format(value) -> tuple[str, Any]:
    if not isinstance(value, dict):
        raise validation_error(
            "response_format", "Input should be a valid dictionary", "dict_type", value
        )
    kind = value.get("type")
    if kind == "structural_tag":
        return "structural_tag", json.dumps(value)
    if kind not in ("text", "json_object", "json_schema"):
        raise validation_error(
            "response_format.type",
            "Input should be 'text', 'json_object' or 'json_schema'",
            "literal_error",
            kind,
            ctx={"expected": "'text', 'json_object' or 'json_schema'"},
        )
    if kind == "text":
        return "text", None
    if kind == "json_object":
        return "json_object", True
    json_schema = value.get("json_schema")
    if json_schema is None:
        raise vllm_error(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            parameter="response_format",
        )
    if not isinstance(json_schema, dict):
        raise validation_error(
            "response_format.json_schema",
            "Input should be a valid dictionary",
            "dict_type",
            json_schema,
        )
    if not isinstance(json_schema.get("name"), str):
        raise validation_error(
            "response_format.json_schema.name", "Field required", "missing", json_schema
        )
    schema = json_schema.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise validation_error(
            "response_format.json_schema.schema",
            "Input should be a valid dictionary",
            "dict_type",
            schema,
        )
    return "json", schema


def _one(fields: dict) -> Constraint | None:
    # StructuredOutputsParams.__post_init__: exactly one constraint, or a 400 quoting its fields.
    options = fields.pop("_options", {})
    named = [key for key in _KINDS if fields.get(key) is not None]
    if len(named) != 1:
        state = {
            "json": fields.get("json"),
            "regex": fields.get("regex"),
            "choice": fields.get("choice"),
            "grammar": fields.get("grammar"),
            "json_object": fields.get("json_object"),
            "disable_any_whitespace": options.get("disable_any_whitespace", False),
            "disable_additional_properties": options.get("disable_additional_properties", False),
            "whitespace_pattern": options.get("whitespace_pattern"),
            "structural_tag": fields.get("structural_tag"),
            "_backend": None,
            "_backend_was_auto": False,
        }
        if named:
            raise vllm_error(
                "You can only use one kind of structured outputs constraint but multiple are "
                f"specified: {state}"
            )
        raise vllm_error(
            "You must use one kind of structured outputs constraint but none are specified: "
            f"{state}"
        )
    kind = named[0]
    if kind in ("grammar", "structural_tag"):
        logger.info("structured outputs by %s are not modelled: the output is unconstrained", kind)
    return Constraint(kind=kind, value=fields[kind])
