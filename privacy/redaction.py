"""Personal data out of a text and back (`Redaction`): each finding replaced by a typed placeholder
(`[PHONE_1]`) before the text leaves, and the placeholders an answer repeats put back as it
streams (`Restorer`), a placeholder split across chunks included.

One `Redaction` serves one request: the same value gets the same placeholder in every message and
in every attempt (a fallback, a continuation), so the model reads one consistent text and the
answer's placeholders all map back. The values stay in this process's memory for the request's
life; nothing writes them anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from privacy.detector import TYPES, detect, types_in

# A placeholder as written, and as a model may repeat it (the type's case changed): `[PHONE_1]`.
_NAMES = "|".join(kind.upper() for kind in TYPES)
_PLACEHOLDER = re.compile(rf"\[(?:{_NAMES})_[0-9]{{1,4}}\]", re.IGNORECASE)
# What may still become one: an opening bracket and the start of a type and number.
_BEGUN = re.compile(r"\[[A-Za-z_]{0,12}[0-9]{0,4}")
_LONGEST = max(len(kind) for kind in TYPES) + 7  # "[" + TYPE + "_" + 4 digits + "]"


class Redaction:
    """One request's placeholders (see the module docstring)."""

    def __init__(
        self,
        *,
        types: Collection[str] | None = None,
        thresholds: Mapping[str, float] | None = None,
    ):
        self._types, self._thresholds = types, thresholds
        self._by_value: dict[tuple[str, str], str] = {}
        self.values: dict[str, str] = {}  # placeholder (upper case) -> the value it stands for
        self.found: set[str] = set()  # the types replaced so far

    def text(self, text: str, *, keep: Collection[str] = ()) -> str:
        """`text` with each finding not of a type in `keep` replaced by its placeholder."""
        findings = [
            f
            for f in detect(text, types=self._types, thresholds=self._thresholds)
            if f.type not in keep
        ]
        if not findings:
            return text
        parts, at = [], 0
        for finding in findings:
            parts += [
                text[at : finding.start],
                self._placeholder(finding.type, text[finding.start : finding.end]),
            ]
            at = finding.end
        parts.append(text[at:])
        return "".join(parts)

    def messages(self, messages: list[dict], *, keep: Collection[str] = ()) -> list[dict]:
        """Chat messages with their texts redacted (content, text parts, tool-call arguments);
        the messages given are left as they are."""
        return [self._message(message, keep) for message in messages]

    def restorer(self) -> Restorer:
        return Restorer(self.values)

    def _placeholder(self, kind: str, value: str) -> str:
        found = self._by_value.get((kind, value))
        if found is None:
            number = sum(1 for k, _ in self._by_value if k == kind) + 1
            found = f"[{kind.upper()}_{number}]"
            self._by_value[(kind, value)] = found
            self.values[found] = value
            self.found.add(kind)
        return found

    def _message(self, message: dict, keep: Collection[str]) -> dict:
        out = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            out["content"] = self.text(content, keep=keep)
        elif isinstance(content, list):
            out["content"] = [
                {**part, "text": self.text(part["text"], keep=keep)}
                if isinstance(part, dict) and isinstance(part.get("text"), str)
                else part
                for part in content
            ]
        if calls := message.get("tool_calls"):
            out["tool_calls"] = [self._call(call, keep) for call in calls]
        return out

    def _call(self, call: object, keep: Collection[str]) -> object:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            return call
        assert isinstance(call, dict)
        arguments = self.text(function["arguments"], keep=keep)
        return {**call, "function": {**function, "arguments": arguments}}


class Restorer:
    """An answer's chunks with the placeholders put back. A chunk ending in what may be the start
    of a placeholder (`[PHO`) keeps that tail until the next chunk settles it, so a placeholder
    split across chunks is restored whole; `flush` gives what is held at the end."""

    def __init__(self, values: Mapping[str, str]):
        self._values = values
        self._held = ""

    def feed(self, chunk: str) -> str:
        text = self._held + chunk
        cut = self._hold_from(text)
        self._held = text[cut:]
        return self._restore(text[:cut])

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _hold_from(self, text: str) -> int:
        start = text.rfind("[")
        if start == -1 or len(text) - start >= _LONGEST or "]" in text[start:]:
            return len(text)
        return start if _BEGUN.fullmatch(text, start) else len(text)

    def _restore(self, text: str) -> str:
        if "[" not in text:
            return text
        return _PLACEHOLDER.sub(lambda m: self._values.get(m.group().upper(), m.group()), text)


def for_curators(*texts: str) -> list[str]:
    """These texts (a question and its answer) as the KB's curators may read them: every finding
    of every type replaced, one placeholder per value across them all. Texts with none (most) are
    returned as they are, read once (`types_in`'s memo)."""
    if not any(types_in(text) for text in texts if text):
        return list(texts)
    redaction = Redaction()
    return [redaction.text(text) for text in texts]
