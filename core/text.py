"""The one check every text input passes before it is stored or sent to a model.

A NUL cannot be stored (PostgreSQL's text type refuses it), a lone surrogate (what a JSON escape
such as "\\ud800" decodes to) is no Unicode at all and cannot be encoded as UTF-8 for the
database or an engine, and the other C0 control characters but tab, line feed and carriage
return have no place in a question or an answer: each used to surface as a 500 after a
rate-limit slot was spent. Interfaces call `text_problem` (or hand `validate_text` to a form or
serializer field) and answer 400 before they count, store or send anything.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

# Chinese, Japanese and Korean characters (CJK radicals to unified ideographs, Hangul syllables,
# compatibility ideographs): written without spaces, each about one token.
CJK_RANGES = r"\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff"

# One pass in C over the text; a typical question costs well under a microsecond.
_REFUSED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """What makes `text` unacceptable, as the end of a sentence for the user ("contains …"),
    or None when it is fine."""
    found = _REFUSED.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        what = "a NUL character (U+0000)"
    elif "\ud800" <= char <= "\udfff":
        what = f"an unpaired surrogate (U+{ord(char):04X}), which is not valid Unicode"
    else:
        what = (
            f"a control character (U+{ord(char):04X}); of those only tab, line feed and carriage "
            "return are allowed"
        )
    return f"contains {what} at character {found.start()}"


def validate_text(value) -> None:
    """`text_problem` as a Django or DRF field validator."""
    if isinstance(value, str) and (problem := text_problem(value)) is not None:
        raise ValidationError(f"The text {problem}.", code="invalid_text")
