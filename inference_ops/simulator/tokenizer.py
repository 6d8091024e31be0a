"""A small deterministic tokenizer.

Prompt token counts, /tokenize and generation all go through this module, so
the numbers a client sees are consistent with each other: re-tokenizing a
generated completion gives back exactly `usage.completion_tokens` tokens.

A token is a word or a single punctuation mark, each keeping the whitespace
that precedes it ("Hello, world" -> ["Hello", ",", " world"]). Joining the
tokens gives back the text unchanged.
"""

import re
import zlib

_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")

# Ids above every hashed id, like the added special tokens of a real vocabulary.
VOCAB_SIZE = 151_643
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_SPECIAL_IDS = {IM_START: 151_644, IM_END: 151_645, "<tool_call>": 151_657, "</tool_call>": 151_658}


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def token_id(token: str) -> int:
    special = _SPECIAL_IDS.get(token)
    if special is not None:
        return special
    # crc32 is stable across processes (unlike hash()), so ids are reproducible.
    return zlib.crc32(token.encode()) % VOCAB_SIZE


def token_ids(tokens: list[str]) -> list[int]:
    return [token_id(t) for t in tokens]
