"""OpenTelemetry traces of the answer pipeline, sent over OTLP/HTTP to a collector.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and
`OTEL_SDK_DISABLED` is not true, read once when this module is imported. Off, nothing from
OpenTelemetry is imported here, `answer_span` hands the pipeline its own function back, and every
other step costs the pipeline one test of `ENABLED`: no span, no context, no SDK.

The spans, named after the OpenTelemetry GenAI semantic conventions:
- `answer {road}`: the whole request (road kb, local or external; plain `answer` when it ended
  before a road was chosen), with the rule, the target, `error.type` (the error event's code) and
  a `first_token` event when the first token left the pipeline;
- `retrieval kb` (gen_ai.operation.name retrieval): the KB match, with its method, score and entry;
- `match rule`: the routing rule chosen;
- `chat {gen_ai.request.model}` (CLIENT): one per engine attempt, so a fallback shows each
  endpoint tried, with `error.type` (the EngineError kind) on the ones that failed.
No question, answer, user or key goes on a span.

Spans leave through a BatchSpanProcessor: ending one appends it to an in-memory queue, and a
thread of the SDK posts batches, so a slow or absent collector never holds a request (a full
queue drops spans). The SDK reads the other standard variables itself: OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT...
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


ENABLED = (
    bool(_env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    and _env("OTEL_SDK_DISABLED").lower() != "true"
)

# when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
SERVICE_NAME = "answering-gateway"
# Bounds one export, retries included, when no OTEL_EXPORTER_OTLP_*TIMEOUT says otherwise: a stalled
# collector holds the SDK's export thread no longer, and atexit's final flush ends as soon.
EXPORT_TIMEOUT = 5.0

T = TypeVar("T")


class _Verdict(Protocol):
    """What `kb_match` reads of the KB's verdict (knowledge.verdict.DirectAnswer)."""

    hit: bool
    method: str
    score: float | None
    entry: Any


V = TypeVar("V", bound=_Verdict)
C = TypeVar("C", bound=tuple)
_lock = threading.Lock()
_tracer = None


def setup() -> None:
    """Configure the SDK now, at process start, instead of on the first request. Nothing when
    off."""
    if ENABLED:
        _get_tracer()


def _get_tracer():
    global _tracer
    if _tracer is None:
        with _lock:
            if _tracer is None:
                _tracer = _start()
    return _tracer


# The API's modules, bound by _start: imported here, they would load OpenTelemetry with tracing off.
_context: Any = None
_trace: Any = None


def _start():
    global _context, _trace
    from opentelemetry import context, trace

    _context, _trace = context, trace
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        timeout = (
            None
            if _env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or _env("OTEL_EXPORTER_OTLP_TIMEOUT")
            else EXPORT_TIMEOUT
        )
        # A provider of our own, not the global one: a forked child builds a new one (below), which
        # the API's set-once global would not allow.
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=timeout)))
        return provider.get_tracer("answering-gateway.pipeline")
    except Exception:  # a bad OTEL_* value must not stop answers
        logger.exception("OpenTelemetry tracing could not start; requests go untraced")
        return trace.NoOpTracer()


def _forget_after_fork() -> None:
    # The child must not export through the parent's HTTP connections (a requests session shared
    # across fork); it builds its own provider on first use.
    global _tracer, _lock
    _tracer, _lock = None, threading.Lock()


if ENABLED:
    os.register_at_fork(after_in_child=_forget_after_fork)


# --- the request span ----------------------------------------------------------------------


def answer_span(
    answer: Callable[..., AsyncGenerator[T, None]],
) -> Callable[..., AsyncGenerator[T, None]]:
    """The pipeline's `answer` inside an `answer {road}` span; `answer` itself when tracing is off.

    The request span is the current span only while the pipeline runs a step, never across its
    yields: the caller's context stays clean, and each step may run in another task (chat.turns
    runs the first one in a task of its own). The span ends with the `done` or `error` event, or
    when the caller closes the stream early (client gone, Stop): every path ends it."""
    if not ENABLED:
        return answer

    @functools.wraps(answer)
    async def traced(*args, **kwargs):
        request = _Request(_get_tracer().start_span("answer"))
        current = _trace.set_span_in_context(request.span)
        events = answer(*args, **kwargs)
        failure: BaseException | None = None
        try:
            while True:
                token = _context.attach(current)
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                finally:
                    _context.detach(token)
                request.saw(event)
                yield event
        except BaseException as exc:
            failure = exc
            raise
        finally:
            token = _context.attach(current)
            try:
                await events.aclose()
            finally:
                _context.detach(token)
                request.end(failure)

    return traced


class _Request:
    __slots__ = ("before_first_token", "ended", "span")

    def __init__(self, span):
        self.span, self.before_first_token, self.ended = span, True, False

    def saw(self, event) -> None:
        kind = event.type
        if kind == "token":
            if self.before_first_token:
                self.before_first_token = False
                self.span.add_event("first_token")
            return
        if kind not in ("route", "done", "error"):
            return
        # The route names the road, rule and target; a done event repeats them, an error may be
        # the first to name them (or come without any).
        attributes = (
            {}
            if kind == "done"
            else {
                f"gateway.{name}": value
                for name in ("road", "rule", "target")
                if (value := getattr(event, name, None))
            }
        )
        if "gateway.road" in attributes:
            self.span.update_name(f"answer {attributes['gateway.road']}")
        if kind != "route" and event.fell_back_from:
            attributes["gateway.fell_back_from"] = list(event.fell_back_from)
        if kind == "error":
            attributes["error.type"] = event.code
            self.span.set_status(_trace.StatusCode.ERROR, event.message)
        self.span.set_attributes(attributes)
        if kind != "route":
            self.end(None)

    def end(self, failure: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        if failure is not None:
            _interrupted(self.span, failure)
        self.span.end()


# --- the steps inside it --------------------------------------------------------------------


async def kb_match(lookup: Awaitable[V]) -> V:
    """`retrieval kb` around the KB check; reads the verdict's hit, method, score and entry."""
    span = _get_tracer().start_span(
        "retrieval kb",
        kind=_trace.SpanKind.CLIENT,
        attributes={"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "kb"},
    )
    try:
        direct = await lookup
    except BaseException as exc:
        _interrupted(span, exc)
        span.end()
        raise
    attributes = {"gateway.kb.hit": direct.hit, "gateway.kb.method": direct.method}
    if direct.score is not None:
        attributes["gateway.kb.score"] = round(float(direct.score), 4)
    if direct.entry is not None:
        attributes["gateway.kb.entry_id"] = direct.entry.pk
    span.set_attributes(attributes)
    span.end()
    return direct


async def rule_match(choosing: Awaitable[C]) -> C:
    """`match rule` around the rule choice; reads the chosen rule's name and action."""
    span = _get_tracer().start_span("match rule")
    try:
        chosen = await choosing
    except BaseException as exc:
        _interrupted(span, exc)
        span.end()
        raise
    rule = chosen[0]
    if rule is not None:
        span.set_attributes({"gateway.rule": rule.name, "gateway.rule.action": rule.action})
    span.end()
    return chosen


class Chat:
    """One engine call: the GenAI `chat {model}` span. Make it before the call, report the first
    chunk and the finish (or the failure), and call `end()` in a `finally`: a call the caller
    abandoned (client gone) ends there, its finish reason `error` as the conventions ask."""

    __slots__ = ("_ended", "_span")

    def __init__(
        self, *, model: str, base_url: str, max_tokens: int | None, temperature: float | None
    ):
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "gen_ai.request.stream": True,
        }
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = int(max_tokens)
        if temperature is not None:
            attributes["gen_ai.request.temperature"] = float(temperature)
        try:
            url = urlsplit(base_url)
            if url.hostname:
                attributes["server.address"] = url.hostname
                attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        except ValueError:  # an unreadable port: the span goes without the server
            pass
        self._span = _get_tracer().start_span(
            f"chat {model}", kind=_trace.SpanKind.CLIENT, attributes=attributes
        )
        self._ended = False

    def first_chunk(self, elapsed: float) -> None:
        """`elapsed`: seconds from the request to the engine to its first content chunk."""
        self._span.set_attribute("gen_ai.response.time_to_first_chunk", round(elapsed, 6))

    def finished(self, finish_reason: str, usage) -> None:
        """The engine's last event: its finish reason and usage (prompt_tokens, completion_tokens)
        or None."""
        attributes = {"gen_ai.response.finish_reasons": [finish_reason]}
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
        self._span.set_attributes(attributes)
        self._end()

    def failed(self, kind: str) -> None:
        self._span.set_attributes({"error.type": kind, "gen_ai.response.finish_reasons": ["error"]})
        self._span.set_status(_trace.StatusCode.ERROR)
        self._end()

    def end(self) -> None:
        if self._ended:
            return
        self._span.set_attribute("gen_ai.response.finish_reasons", ["error"])
        _interrupted(self._span, sys.exc_info()[1])
        self._end()

    def _end(self) -> None:
        self._ended = True
        self._span.end()


def _interrupted(span, exc: BaseException | None) -> None:
    """A span cut short: a caller that went away is no error; anything else is."""
    if exc is None or isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        span.set_attribute("gateway.cancelled", True)
        return
    span.set_attribute("error.type", type(exc).__qualname__)
    span.record_exception(exc)
    span.set_status(_trace.StatusCode.ERROR, str(exc))
