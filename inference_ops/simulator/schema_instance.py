"""A JSON value valid against a JSON schema, built deterministically: what the simulated model
writes under structured outputs (response_format json_schema, structured_outputs json) and as
the arguments of a tool call.

It covers what clients send: pydantic's schemas (objects, $defs and $ref, anyOf for Optional,
enums and Literal, constrained numbers and strings, nested models, lists) and hand-written ones
(`definitions`, type lists, const, allOf). Strings are filled from the text the model would
otherwise have said, so an echo-mode answer stays recognisable inside its JSON.

Not covered (the value may not validate): uniqueItems with several equal items, `not`,
if/then/else, dependent schemas, and schemas no finite value satisfies.
"""

import math
from typing import Any

from . import regex_sample

# Deeper than this, optional properties and array items are left out and Optional picks null,
# so recursive schemas (a tree of nodes) end.
MAX_DEPTH = 6
_HARD_DEPTH = 32  # a schema that recurses through required fields only: give up with null

FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "duration": "P1D",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "iri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
}


def instance(schema: Any, *, text: str) -> Any:
    """A value valid against `schema`; strings take their words from `text`."""
    return _Builder(schema, text).value(schema, 0)


class _Builder:
    def __init__(self, root: Any, text: str):
        self.root = root
        self.text = " ".join(text.split()[:8]) or "example"

    def value(self, schema: Any, depth: int) -> Any:
        if depth > _HARD_DEPTH or schema is False:
            return None
        if not isinstance(schema, dict):
            return self.text  # `true` or a malformed schema: anything goes
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.value({**self._resolve(schema["$ref"]), **rest}, depth + 1)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                rest = {k: v for k, v in schema.items() if k != key}
                return self.value({**rest, **self._pick_branch(branches, depth)}, depth)
        if isinstance(schema.get("allOf"), list):
            return self.value(self._merge_all(schema), depth)

        kind = _type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind == "integer":
            return _number(schema, integer=True)
        if kind == "number":
            return _number(schema, integer=False)
        if kind == "boolean":
            return True
        return None  # "null"

    def _object(self, schema: dict, depth: int) -> dict:
        properties = schema.get("properties") or {}
        required = [name for name in schema.get("required") or [] if isinstance(name, str)]
        out: dict[str, Any] = {}
        for name, sub in properties.items():
            if depth >= MAX_DEPTH and name not in required:
                continue
            out[name] = self.value(sub, depth + 1)
        extra = schema.get("additionalProperties")
        for name in required:
            if name not in out:
                out[name] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
        return out

    def _array(self, schema: dict, depth: int) -> list:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):  # draft 4 tuples
            prefix, items = items, schema.get("additionalItems")
        prefix = prefix if isinstance(prefix, list) else []
        low = _int(schema.get("minItems"), 0)
        high = schema.get("maxItems")
        count = max(low, len(prefix), 0 if depth >= MAX_DEPTH else 1)
        if isinstance(high, int):
            count = min(count, high)
        out = []
        for index in range(count):
            sub = prefix[index] if index < len(prefix) else items
            out.append(self.value(sub if isinstance(sub, dict) else {}, depth + 1))
        return out

    def _string(self, schema: dict) -> str:
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:
                value = regex_sample.sample(pattern)
            except ValueError:
                value = self.text
        else:
            value = FORMATS.get(schema.get("format"), self.text)  # type: ignore[arg-type]  # no format: the text
        low = _int(schema.get("minLength"), 0)
        high = schema.get("maxLength")
        if len(value) < low:
            value += "x" * (low - len(value))
        if isinstance(high, int) and len(value) > high:
            value = value[:high]
        return value

    def _pick_branch(self, branches: list, depth: int) -> dict:
        # Optional[X] is anyOf [X, null]: X, unless the value is already deep in a recursion.
        dicts = [b for b in branches if isinstance(b, dict)] or [{}]
        if depth >= MAX_DEPTH:
            for branch in dicts:
                if branch.get("type") == "null":
                    return branch
        for branch in dicts:
            if branch.get("type") != "null":
                return branch
        return dicts[0]

    def _merge_all(self, schema: dict) -> dict:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if not isinstance(part, dict):
                continue
            if "$ref" in part:
                part = {
                    **self._resolve(part["$ref"]),
                    **{k: v for k, v in part.items() if k != "$ref"},
                }
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                else:
                    merged.setdefault(key, value)
        return merged

    def _resolve(self, ref: Any) -> dict:
        # Local references only: "#/$defs/Name" (pydantic v2), "#/definitions/Name", "#".
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}
        node: Any = self.root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node if isinstance(node, dict) else {}


def _type_of(schema: dict) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"


def _number(schema: dict, *, integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    low = low if _is_number(low) else None
    high = high if _is_number(high) else None
    low_open = high_open = False
    exclusive_min, exclusive_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if exclusive_min is True:  # draft 4: a flag on minimum
        low_open = low is not None
    elif _is_number(exclusive_min) and (low is None or exclusive_min >= low):
        low, low_open = exclusive_min, True
    if exclusive_max is True:
        high_open = high is not None
    elif _is_number(exclusive_max) and (high is None or exclusive_max <= high):
        high, high_open = exclusive_max, True

    step = schema.get("multipleOf")
    step = step if _is_number(step) and step > 0 else (1 if integer else None)  # type: ignore[operator]  # _is_number: a number
    if integer and step is not None and step != int(step):
        step = None

    def fits(value: float) -> bool:
        if low is not None and (value < low or (low_open and value == low)):
            return False
        return not (high is not None and (value > high or (high_open and value == high)))

    # One, pulled into the range; on a grid of multipleOf when there is one.
    value: float = 1
    if not fits(value):
        if low is not None and value <= low:
            value = low + 1 if low_open else low
        elif high is not None:
            value = high - 1 if high_open else high
        if not fits(value) and low is not None and high is not None:
            value = (low + high) / 2
    if step is not None:
        up = math.ceil(value / step) * step
        value = up if fits(up) else math.floor(value / step) * step
    if integer:
        value = math.ceil(value) if fits(math.ceil(value)) else math.floor(value)
        return int(value)
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
