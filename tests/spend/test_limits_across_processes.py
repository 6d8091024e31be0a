"""A limit holds for the whole deployment, not per process: two web processes (the production
launcher, one socket) and 64 concurrent streams of one key together stay within its tokens per
minute, give or take one request's reservation (LiteLLM #40291 counted in local memory, and a
limit became limit x replicas)."""

import asyncio
import contextlib

import openai
import pytest
from django.conf import settings

from benchmarks.servers import gateway
from chat.apikeys import apikey_create
from spend.models import Limit
from tests.spend.test_limits import key_row, same_minute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

STREAMS = 64
MAX_TOKENS = 48
QUESTION = [{"role": "user", "content": "Describe the harbour at dawn, its boats and its gulls"}]


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


async def _burst(url: str, key: str) -> tuple[list[int], int]:
    """STREAMS streams at once: the tokens each answered one used, and how many were refused."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)

    async def one() -> int | None:
        try:
            stream = await client.chat.completions.create(
                model="auto",
                messages=QUESTION,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            )
        except openai.RateLimitError:
            return None
        used = 0
        async for chunk in stream:
            if chunk.usage is not None:
                used = chunk.usage.total_tokens
        return used

    try:
        results = await asyncio.gather(*(one() for _ in range(STREAMS)))
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return [r for r in results if r is not None], sum(r is None for r in results)


def test_two_processes_and_64_streams_stay_within_one_reservation_of_the_limit(
    two_processes, alice, product
):
    # One request's reservation, as the gateway counts it: asked once under a roomy limit.
    probe = apikey_create(user=alice, name="probe", scopes=["chat"])[1]
    Limit.objects.create(api_key=key_row(probe), tokens_per_minute=1_000_000)
    # Under the limit below, about a quarter of the burst fits.
    raw = apikey_create(user=alice, name="burst", scopes=["chat"])[1]
    same_minute(40)
    answer = openai.OpenAI(
        base_url=f"{two_processes}/v1", api_key=probe, max_retries=0, timeout=30
    ).chat.completions.with_raw_response.create(
        model="auto", messages=QUESTION, max_tokens=MAX_TOKENS
    )
    reservation = 1_000_000 - int(answer.headers["x-ratelimit-remaining-tokens"])
    limit = reservation * STREAMS // 4
    Limit.objects.create(api_key=key_row(raw), tokens_per_minute=limit)

    answered, refused = asyncio.run(_burst(two_processes, raw))

    spent = sum(answered)
    assert refused > 0 and answered, (len(answered), refused)
    # Counted once for both processes: never past the limit by more than one reservation (with
    # a count per process, the burst would have had twice the room).
    assert spent <= limit + reservation, (spent, limit, reservation)
