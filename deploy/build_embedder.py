"""Export the default embedding model's ONNX graph into KB_EMBEDDING_CACHE_DIR, at image build.

Every machine otherwise exports it once, with PyTorch, on its first embedding; in containers each
new container is a new machine, and every web pod would pay that before it listens. One real
embedding builds and checks the graph exactly as a web process would (knowledge.embedding).

Run from the Dockerfile, with the settings' placeholders: `python deploy/build_embedder.py`.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

from config.bootstrap import process_setup

process_setup()
django.setup()

from knowledge.embedding import E5_SMALL, EmbeddingSpec, embed_texts, embedder_for  # noqa: E402

spec = EmbeddingSpec(name=E5_SMALL, backend="local", dimensions=384)
embed_texts(spec, ["warm-up"])
runtime = embedder_for(spec).runtime
if runtime != "onnx":
    sys.exit(f"the {E5_SMALL} graph was not built (runtime {runtime!r}); see the warning above")
print(f"{E5_SMALL}: ONNX graph ready in {os.environ.get('KB_EMBEDDING_CACHE_DIR')}")
