import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _every_probe_checks(settings):
    """These tests change what the checks reach between probes: no verdict is reused."""
    from config import health

    settings.READYZ_CACHE_SECONDS = 0
    health.verdict_forget()


def test_healthz_answers_without_touching_dependencies(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # even with Redis unreachable
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_ready_with_database_redis_and_a_live_worker(admin_client, celery_worker):
    response = admin_client.get("/readyz")  # staff see each check's detail
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert set(body["checks"]) == {"database", "redis", "celery", "warm"}
    assert body["checks"]["database"]["detail"].startswith("pgvector ")
    assert body["checks"]["redis"]["detail"] == "PONG"
    assert "test-" in body["checks"]["celery"]["detail"]


def test_readyz_says_when_this_process_has_not_warmed(admin_client, settings, celery_worker):
    client = admin_client
    # The test client does not import config.asgi: nothing warmed here, and that is no failure.
    # What a daphne process warms is tested over HTTP in tests/config/test_web.py.
    settings.WEB_WARMUP = True  # as in production (tests/settings.py turns it off for this process)
    body = client.get("/readyz").json()
    assert body["checks"]["warm"] == {
        "ok": True,
        "detail": "not run in this process (it runs in config.asgi)",
        "ms": body["checks"]["warm"]["ms"],
    }
    settings.WEB_WARMUP = False
    body = client.get("/readyz").json()
    assert body["checks"]["warm"]["detail"] == "off (WEB_WARMUP)"
    assert "warm" not in body["failing"]


def test_readyz_names_redis_when_redis_is_down(admin_client, settings, celery_worker):
    # A real connection to a port where nothing listens: connection refused.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    response = admin_client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "fail"
    assert "redis" in body["failing"]
    assert "Connection" in body["checks"]["redis"]["error"]
    assert body["checks"]["database"]["ok"] is True


def test_anonymous_callers_of_readyz_see_which_checks_fail_but_no_detail(
    client, settings, celery_worker, caplog
):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    with caplog.at_level("WARNING", logger="config.health"):
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["redis", "celery"]
    assert body["checks"] == {
        name: {"ok": name not in ("redis", "celery")}
        for name in ("database", "redis", "celery", "warm")
    }
    # No host, port, user, version or exception text for anyone who asks.
    for secret in (
        "127.0.0.1",
        "Connection",
        "Error",
        "pgvector",
        "PONG",
        settings.DATABASES["default"]["USER"],
    ):
        assert secret not in response.content.decode()
    # The operator finds the reason in the log.
    assert any("redis" in r.getMessage() and "Connection" in r.getMessage() for r in caplog.records)


def test_a_logged_in_non_staff_user_sees_no_detail_either(client, django_user_model, celery_worker):
    client.force_login(django_user_model.objects.create_user("carol", password="pw-carol-123456"))
    body = client.get("/readyz").json()
    assert body["status"] == "ok"
    assert body["checks"]["database"] == {"ok": True}


def test_readyz_names_celery_when_no_worker_listens(admin_client, settings, celery_worker):
    # Redis is up, but no worker consumes this broker database.
    settings.CELERY_BROKER_URL = settings.REDIS_URL.rsplit("/", 1)[0] + "/14"
    response = admin_client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["celery"]
    assert body["checks"]["celery"]["error"] == "RuntimeError: no Celery worker answered ping"


@pytest.mark.processes
def test_readyz_names_the_database_when_postgres_refuses_within_its_own_timeout(child_env):
    """A balancer's probe gives up after a second or so: the check waits READYZ_TIMEOUT, not the
    pool's wait for a connection, which is a request's (it was 10 s, and /readyz took 11)."""
    # A separate process, so the test's own database connection stays intact.
    env = {
        **child_env,
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/gateway",
        "DATABASE_CONNECT_TIMEOUT": "2",
        "DATABASE_POOL_TIMEOUT": "60",
        "READYZ_TIMEOUT": "0.5",
    }
    script = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client().get('/readyz'); print(r.status_code); print(r.content.decode())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    status, body = result.stdout.strip().split("\n", 1)
    # What the operator reads in the log: the check gave up after READYZ_TIMEOUT, not the pool's.
    assert "couldn't get a connection after 0.50 sec" in result.stderr, result.stderr
    body = json.loads(body)
    assert status == "503", result.stderr
    assert "database" in body["failing"]
    assert body["checks"]["database"] == {"ok": False}  # named, with no host, port or user
    assert body["checks"]["redis"]["ok"] is True
    assert "127.0.0.1" not in json.dumps(body) and "postgres" not in json.dumps(body)
    assert "database" in result.stderr and "127.0.0.1" in result.stderr  # the detail is in the log


# --- a probe that anyone may call is not an amplifier --------------------------------------------

METRICS_TOKEN = "scrape-token-for-the-health-tests-0123"


@pytest.fixture
def fresh_verdict(settings):
    """Each test starts with no verdict from an earlier one, its window a long one."""
    from config import health

    settings.READYZ_CACHE_SECONDS = 3600
    settings.METRICS_TOKEN = METRICS_TOKEN
    health.verdict_forget()
    yield
    health.verdict_forget()


def _checks_run(scrape: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
        if sample.name == "gateway_readyz_checks_total"
    )


def _scrape(client) -> str:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200
    return response.content.decode()


def test_many_probes_within_the_window_run_the_checks_once(client, fresh_verdict, celery_worker):
    before = _checks_run(_scrape(client))
    answers = [client.get("/readyz") for _ in range(10)]

    assert [answer.status_code for answer in answers] == [200] * 10
    # One run of the checks: one query (it takes its own pooled connection, not Django's).
    assert _checks_run(_scrape(client)) - before == 1
    # Each answer says how old its verdict is.
    assert all(answer.json()["age"] >= 0 for answer in answers)


@pytest.mark.django_db(transaction=True)
async def test_probes_arriving_together_share_one_check(fresh_verdict, celery_worker):
    import asyncio

    from django.test import AsyncClient

    client = AsyncClient()

    async def scrape() -> str:
        response = await client.get(
            "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
        return response.content.decode()

    before = _checks_run(await scrape())
    answers = await asyncio.gather(*(client.get("/readyz") for _ in range(20)))

    assert {answer.status_code for answer in answers} == {200}
    assert _checks_run(await scrape()) - before == 1


def test_after_the_window_the_next_probe_checks_again(
    client, fresh_verdict, settings, celery_worker
):
    settings.READYZ_CACHE_SECONDS = 0
    before = _checks_run(_scrape(client))
    for _ in range(3):
        client.get("/readyz")
    assert _checks_run(_scrape(client)) - before == 3


def test_the_redis_check_keeps_its_connection(client, fresh_verdict, settings, celery_worker):
    import redis as redis_client

    settings.READYZ_CACHE_SECONDS = 0
    name = f"{settings.REDIS_KEY_PREFIX}:readyz"
    server = redis_client.Redis.from_url(settings.REDIS_URL, socket_timeout=2)

    def connections() -> list[int]:
        return [entry["id"] for entry in server.client_list() if entry.get("name") == name]

    client.get("/readyz")
    first = connections()
    for _ in range(3):
        client.get("/readyz")
    assert len(first) == 1 and connections() == first
