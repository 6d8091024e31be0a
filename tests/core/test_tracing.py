"""OpenTelemetry traces of the answer pipeline, as a collector receives them over OTLP/HTTP.

The pipeline runs in processes of its own (tests/core/traced_pipeline.py) on the test database
and the vLLM simulator, because tracing is decided once per process from its environment; the
spans arrive at a real OTLP/HTTP receiver on loopback. Starting such a process costs seconds, so
the traced cases share one: it asks one question per case, and each test reads its question's trace.
"""

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from core.processes import free_port
from inference_ops.models import ModelEndpoint
from knowledge.models import Entry
from knowledge.services.entries import entry_create
from routing.models import RoutingRule
from tests.support.factories import endpoint, rule

# Every test asks for the database, also those that only read the shared run's spans: pytest-django
# sets up the test database only for a session with a test that asks, and the shared rows must
# go there, never into the development database.
pytestmark = pytest.mark.django_db

QUESTION = "Tell me a long story about the old harbours of Brittany"


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict
    events: list[str]
    status: int
    start: int
    seconds: float
    service: str


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


@dataclass
class Collector:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def collector():
    """An OTLP/HTTP trace receiver on loopback: what a collector would get."""
    received = Collector(url="")

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # the handler's API
            received.posts.append(self.path)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        received.spans.append(
                            ReceivedSpan(
                                name=span.name,
                                kind=span.kind,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                events=[e.name for e in span.events],
                                status=span.status.code,
                                start=span.start_time_unix_nano,
                                seconds=(span.end_time_unix_nano - span.start_time_unix_nano) / 1e9,
                                service=resource.get("service.name"),
                            )
                        )
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    server.shutdown()
    server.server_close()


def run_pipeline(child_env: dict, otel: dict, *questions: dict) -> tuple[list[list[dict]], dict]:
    """Each question's events, and what the process loaded of OpenTelemetry; `otel`: its OTEL_*
    variables."""
    env = {key: value for key, value in child_env.items() if not key.startswith("OTEL_")} | otel
    done = subprocess.run(
        [sys.executable, "-m", "tests.core.traced_pipeline", json.dumps(list(questions))],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith(("[", "{"))]
    return lines[:-1], lines[-1]


@dataclass
class Trace:
    events: list[dict]
    root: ReceivedSpan
    children: list[ReceivedSpan]

    def child(self, name: str) -> ReceivedSpan:
        (span,) = [s for s in self.children if s.name == name]
        return span


CASES = {  # case: the question it asks (its rule is picked by a keyword)
    "kb": {"text": "how do i reset my password"},
    "generated": {"text": QUESTION, "max_tokens": 6, "temperature": 0.5},
    "fallback": {"text": "A story about a lighthouse, please", "max_tokens": 3},
    "unanswerable": {"text": "A story about a shipwreck, please", "max_tokens": 3},
    "client_left": {"text": QUESTION, "max_tokens": 200, "stop_after": 2},
}


@pytest.fixture(scope="module")
def rows(django_db_setup, django_db_blocker, local_sim):
    """Committed rows, for the pipeline's own processes; removed after the module."""
    with django_db_blocker.unblock():
        local = endpoint("tr-local", local_sim)
        # Two retries after the first try (the default), each try a span of its own; and none.
        broken_a = endpoint(
            "tr-broken-a", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=2, retry_base=0
        )
        broken_b = endpoint(
            "tr-broken-b", local_sim, extra_headers={"X-Sim-Fail": "500"}, retries=0
        )
        made = {
            "entry": entry_create(
                question="How do I reset my password?",
                answer="Use *Forgot password*.",
                embed="none",
            ),
            "rules": [
                rule("tr-default", local, is_default=True, priority=1000, use_kb_context=False),
                rule(
                    "tr-fallback",
                    broken_a,
                    local,
                    keywords=["lighthouse"],
                    priority=1,
                    use_kb_context=False,
                ),
                rule(
                    "tr-hopeless",
                    broken_b,
                    keywords=["shipwreck"],
                    priority=2,
                    use_kb_context=False,
                ),
            ],
        }
    yield made
    with django_db_blocker.unblock():
        Entry.objects.filter(pk=made["entry"].pk).delete()
        RoutingRule.objects.filter(name__startswith="tr-").delete()
        ModelEndpoint.objects.filter(name__startswith="tr-").delete()


@pytest.fixture(scope="module")
def traces(rows, child_env, collector) -> dict[str, Trace]:
    """Every case asked in one traced process: each case's events and the spans of its trace."""
    answers, _ = run_pipeline(
        child_env, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}, *CASES.values()
    )
    roots = sorted((s for s in collector.spans if not s.parent_id), key=lambda s: s.start)
    assert len(roots) == len(CASES), [r.name for r in roots]
    return {
        case: Trace(
            events=events,
            root=root,
            children=[
                s
                for s in collector.spans
                if s.parent_id == root.span_id and s.trace_id == root.trace_id
            ],
        )
        for case, events, root in zip(CASES, answers, roots, strict=True)
    }


def test_a_kb_answer_is_one_request_span_with_its_kb_match(traces, rows, collector):
    entry, kb = rows["entry"], traces["kb"]
    assert [e["type"] for e in kb.events] == ["route", "token", "done"]
    root = kb.root
    assert root.name == "answer kb" and root.service == "answering-gateway"
    assert (
        root.attributes["gateway.road"] == "kb"
        and root.attributes["gateway.target"] == f"KB#{entry.pk}"
    )
    assert root.events == ["first_token"]
    assert [s.name for s in kb.children] == ["retrieval kb"]
    match = kb.child("retrieval kb")
    assert match.kind == ProtoSpan.SPAN_KIND_CLIENT
    assert match.attributes == {
        "gen_ai.operation.name": "retrieval",
        "gen_ai.data_source.id": "kb",
        "gateway.kb.hit": True,
        "gateway.kb.method": "exact",
        "gateway.kb.entry_id": entry.pk,
        "gateway.kb.score": 1.0,
    }
    assert set(collector.posts) == {"/v1/traces"}


def test_a_generated_answer_has_a_chat_span_with_the_genai_attributes(traces, local_sim):
    generated = traces["generated"]
    done = generated.events[-1]
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 6
    root = generated.root
    assert root.name == "answer local"
    assert {k: root.attributes[k] for k in ("gateway.road", "gateway.rule", "gateway.target")} == {
        "gateway.road": "local",
        "gateway.rule": "tr-default",
        "gateway.target": "tr-local",
    }
    assert sorted(s.name for s in generated.children) == [
        "chat acme/local",
        "match rule",
        "retrieval kb",
    ]
    assert generated.child("retrieval kb").attributes["gateway.kb.hit"] is False
    assert generated.child("match rule").attributes["gateway.rule"] == "tr-default"
    chat = generated.child("chat acme/local")
    assert chat.kind == ProtoSpan.SPAN_KIND_CLIENT
    ttft = chat.attributes.pop("gen_ai.response.time_to_first_chunk")
    assert 0 < ttft <= chat.seconds
    assert chat.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "acme/local",
        "gen_ai.request.stream": True,
        "gen_ai.request.max_tokens": 6,
        "gen_ai.request.temperature": 0.5,
        "server.address": "127.0.0.1",
        "server.port": int(local_sim.url.rsplit(":", 1)[1]),
        "gen_ai.response.finish_reasons": ["length"],
        "gen_ai.usage.input_tokens": done["usage"]["prompt_tokens"],
        "gen_ai.usage.output_tokens": 6,
    }


def test_no_span_carries_the_question(traces, collector):
    spoken = [v for s in collector.spans for v in s.attributes.values() if isinstance(v, str)]
    assert spoken and not [
        v for v in spoken if "harbour" in v or "lighthouse" in v or "password" in v
    ]


def test_a_failed_attempt_is_a_failed_chat_span_before_the_one_that_answers(traces):
    fallback = traces["fallback"]
    assert fallback.events[-1]["type"] == "done" and fallback.events[-1]["fell_back_from"] == [
        "tr-broken-a"
    ]
    assert fallback.root.name == "answer local" and fallback.root.status != Status.STATUS_CODE_ERROR
    assert fallback.root.attributes["gateway.fell_back_from"] == ["tr-broken-a"]
    *failed, answered = sorted(
        (s for s in fallback.children if s.name == "chat acme/local"), key=lambda s: s.start
    )
    assert len(failed) == 3  # the first try and its two retries, one span each
    for span in failed:
        assert (
            span.attributes["error.type"] == "server_error"
            and span.status == Status.STATUS_CODE_ERROR
        )
        assert span.attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert "error.type" not in answered.attributes and answered.status != Status.STATUS_CODE_ERROR
    assert answered.attributes["gen_ai.response.finish_reasons"] == ["length"]


def test_a_request_no_target_can_answer_is_an_error_span(traces):
    unanswerable = traces["unanswerable"]
    assert [e["type"] for e in unanswerable.events] == ["error"] and unanswerable.events[0][
        "code"
    ] == "server_error"
    root = unanswerable.root
    assert root.name == "answer" and root.status == Status.STATUS_CODE_ERROR
    assert root.attributes["error.type"] == "server_error"
    assert unanswerable.child("chat acme/local").attributes["error.type"] == "server_error"


def test_a_client_that_leaves_mid_answer_still_gets_every_span_ended(traces):
    left = traces["client_left"]
    assert [e["type"] for e in left.events] == ["route", "token"]
    root, chat = left.root, left.child("chat acme/local")
    assert root.name == "answer local" and root.status != Status.STATUS_CODE_ERROR
    assert root.attributes["gateway.cancelled"] is True
    assert chat.attributes["gateway.cancelled"] is True and "error.type" not in chat.attributes
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert "gen_ai.usage.output_tokens" not in chat.attributes


@pytest.mark.processes
def test_without_an_endpoint_no_span_is_made_and_the_tracing_sdk_is_not_loaded(rows, child_env):
    (events,), loaded = run_pipeline(
        child_env, {"OTEL_SERVICE_NAME": "gw-under-test"}, {"text": QUESTION, "max_tokens": 3}
    )

    assert events[-1]["type"] == "done"
    assert loaded["wrapped"] is False  # `answer` is the pipeline's own generator
    assert not [
        m
        for m in loaded["modules"]
        if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter"))
    ]


def test_an_unreachable_collector_does_not_change_the_answer(rows, child_env):
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_SERVICE_NAME": "gw-under-test",
    }
    (events,), loaded = run_pipeline(child_env, otel, {"text": QUESTION, "max_tokens": 3})

    assert [events[0]["type"], events[-1]["type"]] == ["route", "done"]
    assert (
        "".join(e["text"] for e in events if e["type"] == "token")
        and events[-1]["usage"]["completion_tokens"] == 3
    )
    assert loaded["wrapped"] is True


FORKING = """
import os, sys, time
from core import tracing

def call(model):
    chat = tracing.Chat(
        model=model, base_url="http://127.0.0.1:8001/v1", max_tokens=1, temperature=None
    )
    chat.finished("stop", None)

call("before-fork")
time.sleep(0.5)  # exported: the parent's exporter now holds a connection to the collector
if os.fork() == 0:
    call("in-child")
    sys.exit(0)
os.wait()
call("in-parent")
"""


def test_a_forked_process_sends_its_own_spans(collector):
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    done = subprocess.run(
        [sys.executable, "-c", FORKING],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    expected = ["chat before-fork", "chat in-child", "chat in-parent"]
    assert sorted(s.name for s in collector.spans if s.name in expected) == expected
