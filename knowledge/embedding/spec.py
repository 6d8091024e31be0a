"""What an embedding model is to this project: its spec, the roles a text is embedded in, and the
similarities at which its vectors mean something.

Each text is embedded in a role: `query` for the questions asked (and the routing rules'
examples they are compared with), `passage` for what the KB stores and retrieves: FAQ phrasings
and context passages. For FAQ phrasings E5's advice for symmetric pairs (`query: ` on both
sides) was measured against this: on benchmarks/kb_labelled, at precision 1.00, `passage: `
answered 47 questions to 40.
"""

from __future__ import annotations

from dataclasses import dataclass

MINILM = "all-MiniLM-L6-v2"
E5_SMALL = "multilingual-e5-small"
QUERY, PASSAGE = "query", "passage"


@dataclass(frozen=True)
class EmbeddingSpec:
    name: str
    backend: str
    dimensions: int
    base_url: str = ""
    api_key_env: str = ""
    query_prefix: str = ""
    passage_prefix: str = ""

    def prefixed(self, texts: list[str], role: str) -> list[str]:
        prefix = self.query_prefix if role == QUERY else self.passage_prefix
        return [prefix + text for text in texts] if prefix else texts


def spec_of(model) -> EmbeddingSpec:
    """The spec of an `EmbeddingModel` row (read by attribute: this module imports no model)."""
    return EmbeddingSpec(
        name=model.name,
        backend=model.backend,
        dimensions=model.dimensions,
        base_url=model.base_url,
        api_key_env=model.api_key_env,
        query_prefix=model.query_prefix,
        passage_prefix=model.passage_prefix,
    )


@dataclass(frozen=True)
class OperatingPoint:
    """Where a model's similarities mean something: each model has its own scale (E5's unrelated
    questions score about 0.8, MiniLM's about 0.2)."""

    threshold: float  # a direct answer
    margin: float  # a direct answer's lead over the runner-up
    context_min: float  # a passage worth putting in the prompt
    group: float  # two KB misses that ask the same
    intent: float  # a question like a routing rule's examples (the demo rules' setting)


# Each model's defaults. Threshold and margin: `manage.py kb_calibrate` on the labelled set in
# benchmarks/kb_labelled at precision 0.98 (docs/benchmarks.md#fig-kb-quality); the others
# measured on this project's test and demo texts. A model not listed starts from MiniLM's.
OPERATING_POINTS = {
    MINILM: OperatingPoint(threshold=0.80, margin=0.05, context_min=0.30, group=0.75, intent=0.55),
    E5_SMALL: OperatingPoint(
        threshold=0.935, margin=0.02, context_min=0.82, group=0.90, intent=0.86
    ),
}


def operating_point(name: str) -> OperatingPoint:
    return OPERATING_POINTS.get(name, OPERATING_POINTS[MINILM])
