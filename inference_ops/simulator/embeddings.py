"""/v1/embeddings for a simulated pooling model (vLLM serves it for embedding models).

The vectors are feature hashes of words and character trigrams: deterministic,
L2-normalised, and texts that share words land near each other. Not a language
model, but a real vector space, enough to exercise an embedding client and a
model switch end to end.
"""

import base64
import math
import re
import struct
import zlib

_WORD = re.compile(r"\w+", re.UNICODE)


def embed(text: str, dim: int) -> list[float]:
    vector = [0.0] * dim
    for word in _WORD.findall(text.casefold()):
        features = [f"w:{word}"] + [f"c:{word[i : i + 3]}" for i in range(max(1, len(word) - 2))]
        for feature in features:
            digest = zlib.crc32(feature.encode())
            sign = 1.0 if digest & 1 else -1.0
            vector[(digest >> 1) % dim] += sign * (2.0 if feature.startswith("w:") else 1.0)
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def encode(vector: list[float], encoding_format: str):
    if encoding_format == "base64":
        # What the OpenAI SDK asks for by default: little-endian float32, base64.
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
