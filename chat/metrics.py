"""The gateway's own Prometheus metrics (served at /metrics). Being written: the calls the
request path makes are in place and do nothing yet."""

from __future__ import annotations

from chat.requestlog import RequestRecord


def request_started(interface: str) -> None:
    pass


def request_ended(record: RequestRecord) -> None:
    pass


def response_refused(interface: str, status: int, code: str) -> None:
    pass
