"""The embedded Redis used where no Redis answers on 127.0.0.1:6379."""

import pytest
import redis

from core.processes import free_port
from devtools import embedded

pytestmark = pytest.mark.processes


def test_an_embedded_redis_starts_serves_and_stops(tmp_path):
    port = free_port()
    assert not embedded.redis_answers("127.0.0.1", port)

    assert embedded.redis_start(port=port, data_dir=tmp_path) is True
    try:
        client = redis.Redis(port=port, socket_timeout=2)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        # A second start finds it answering and reuses it.
        assert embedded.redis_start(port=port, data_dir=tmp_path) is False
    finally:
        assert embedded.redis_stop(data_dir=tmp_path) is True
    assert not embedded.redis_answers("127.0.0.1", port)
