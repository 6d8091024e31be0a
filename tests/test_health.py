import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.django_db


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
    # What a daphne process warms is tested over HTTP in tests/test_web.py.
    settings.WEB_WARMUP = True  # as in production (tests/settings.py turns it off for this process)
    body = client.get("/readyz").json()
    assert body["checks"]["warm"] == {"ok": True, "detail": "not run in this process (it runs in config.asgi)",
                                      "ms": body["checks"]["warm"]["ms"]}
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


def test_anonymous_callers_of_readyz_see_which_checks_fail_but_no_detail(client, settings, celery_worker, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    with caplog.at_level("WARNING", logger="config.health"):
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["redis", "celery"]
    assert body["checks"] == {name: {"ok": name not in ("redis", "celery")}
                              for name in ("database", "redis", "celery", "warm")}
    # No host, port, user, version or exception text for anyone who asks.
    for secret in ("127.0.0.1", "Connection", "Error", "pgvector", "PONG", settings.DATABASES["default"]["USER"]):
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


def test_readyz_names_the_database_when_postgres_refuses(child_env):
    # A separate process, so the test's own database connection stays intact.
    env = {**child_env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/gateway", "DATABASE_CONNECT_TIMEOUT": "2"}
    script = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client().get('/readyz'); print(r.status_code); print(r.content.decode())"
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    status, body = result.stdout.strip().split("\n", 1)
    body = json.loads(body)
    assert status == "503", result.stderr
    assert "database" in body["failing"]
    assert body["checks"]["database"] == {"ok": False}  # named, with no host, port or user
    assert body["checks"]["redis"]["ok"] is True
    assert "127.0.0.1" not in json.dumps(body) and "postgres" not in json.dumps(body)
    assert "database" in result.stderr and "127.0.0.1" in result.stderr  # the detail is in the log
