"""config.twisted_tuning: direct writes lose, reorder or double no byte, also when the socket
takes only part of a write and the rest must wait in Twisted's buffer."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def test_a_slow_reader_gets_every_byte_of_many_small_writes_in_order():
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "twisted_writer.py"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    got, sent, size = run.stdout.split()
    assert int(size) > 2_000_000  # far more than the socket buffers hold: partial sends happen
    assert got == sent


def test_the_content_type_parse_is_remembered_and_answers_as_before():
    from twisted.web import http

    from config import twisted_tuning

    twisted_tuning.tune()
    twisted_tuning.tune()  # idempotent: not wrapped twice
    assert not hasattr(http._parseContentType.__wrapped__, "cache_info")
    before = http._parseContentType.cache_info().hits
    for _ in range(3):
        assert http._parseContentType(b"application/json; charset=utf-8") == b"application/json"
        assert http._parseContentType(b"multipart/form-data; boundary=x") == b"multipart/form-data"
    assert http._parseContentType.cache_info().hits >= before + 4


def test_daphne_writes_body_chunks_through_twisted_web_http_itself_not_its_deprecation_proxy():
    import types

    from daphne import http_protocol
    from twisted.web import http

    from config import twisted_tuning

    twisted_tuning.tune()
    assert type(http_protocol.http) is types.ModuleType
    assert (
        http_protocol.http.Request is http.Request
        and http_protocol.http.__name__ == "twisted.web.http"
    )
