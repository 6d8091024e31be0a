"""A limit holds for the whole deployment, not per process: two web processes (the production
launcher, one socket) and 64 concurrent streams of one key together stay within its tokens per
minute, give or take one request's reservation (LiteLLM #40291 counted in local memory, and a
limit became limit x replicas)."""

import asyncio

import pytest
from django.conf import settings

from benchmarks.servers import gateway
from benchmarks.spend import burst, reservation_of
from chat.apikeys import apikey_create
from spend.models import Limit
from tests.spend.test_limits import key_row, same_minute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

STREAMS = 64
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def two_processes(child_env, tmp_path_factory):
    env = {
        **child_env,
        "DEBUG": "false",
        "SECRET_KEY": settings.SECRET_KEY,
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        # Only the spend limit may refuse: the per-user rate and streams caps are lifted.
        "CHAT_RATE_LIMIT": "100000",
        "CHAT_MAX_STREAMS_PER_USER": "100000",
    }
    log = tmp_path_factory.mktemp("two-processes") / "web.log"
    with gateway(env=env, log_path=log, web_concurrency=2) as running:
        yield running.url


def test_two_processes_and_64_streams_stay_within_one_reservation_of_the_limit(
    two_processes, alice, product
):
    # One request's reservation, as the gateway counts it: asked once under a roomy limit.
    probe = apikey_create(user=alice, name="probe", scopes=["chat"])[1]
    Limit.objects.create(api_key=key_row(probe), tokens_per_minute=1_000_000)
    raw = apikey_create(user=alice, name="burst", scopes=["chat"])[1]
    same_minute(40)
    reservation = reservation_of(
        url=two_processes, key=probe, max_tokens=MAX_TOKENS, limit=1_000_000
    )
    # Room for about a quarter of the burst.
    limit = reservation * STREAMS // 4
    Limit.objects.create(api_key=key_row(raw), tokens_per_minute=limit)

    result = asyncio.run(burst(url=two_processes, key=raw, streams=STREAMS, max_tokens=MAX_TOKENS))

    assert result.refused > 0 and result.answered, result
    # Counted once for both processes: never past the limit by more than one reservation (with
    # a count per process, the burst would have had twice the room).
    assert result.spent <= limit + reservation, (result.spent, limit, reservation)
