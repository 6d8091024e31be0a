import contextlib
import os
import shutil
import subprocess
import sys

import pytest
from django.conf import settings

from core.processes import stop_group
from devtools import embedded
from tests.support import orphans
from tests.support.processes import url_with_database


def pytest_configure(config):
    for command in orphans.sweep():
        print(f"killed, left by a killed test run: {command}", file=sys.stderr)
    orphans.tag_this_run()
    embedded.hold()


# A test that uses one of these fixtures is marked so (pytest.ini's markers; make test-fast).
SLOW_FIXTURES = {
    "real_vllm": "engines",
    "celery_worker": "processes",
    "asgi_server": "processes",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in SLOW_FIXTURES.keys() & set(item.fixturenames):
            item.add_marker(SLOW_FIXTURES[fixture])


def pytest_unconfigure(config):
    # The last holder out stops the embedded servers (a running `make run` keeps them).
    embedded.release()
    # This run's metric files (its folder is its own: named after its Redis key prefix).
    if settings.METRICS_DIR.name == settings.REDIS_KEY_PREFIX:
        shutil.rmtree(settings.METRICS_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_serving_model():
    """Each test's database starts empty: the process must not trust an embedding-model row
    cached by an earlier test."""
    from knowledge.selectors import serving_model_forget

    serving_model_forget()
    yield
    serving_model_forget()


# The users the tests act as, wherever they are.
@pytest.fixture
def alice(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("alice", password="pw-alice-123456")


@pytest.fixture
def bob(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("bob", password="pw-bob-123456")


@pytest.fixture
def alice_key(alice):
    from chat.apikeys import apikey_create

    return apikey_create(user=alice, name="laptop", scopes=["chat"])[1]


# Signed-in clients, for the admin pages' tests.
@pytest.fixture
def curator_client(django_user_model):
    """Staff with every permission of the knowledge app, and no other; not a superuser."""
    from django.contrib.auth.models import Permission

    from tests.support.personas import client_of

    curator = django_user_model.objects.create_user(
        "curator", password="pw-curator-123456", is_staff=True
    )
    curator.user_permissions.set(Permission.objects.filter(content_type__app_label="knowledge"))
    return client_of(curator)


@pytest.fixture
def user_client(django_user_model):
    """A user who is not staff."""
    from tests.support.personas import client_of

    return client_of(django_user_model.objects.create_user("user", password="pw-user-123456"))


@pytest.fixture
def product(local_sim, external_sim):
    """A KB entry, a local and an external endpoint, and a default rule local → external."""
    from knowledge.services.entries import entry_create
    from tests.support.factories import endpoint, rule

    entry = entry_create(
        question="How do I reset my password?", answer="Use **Forgot password**.", embed="sync"
    )
    local = endpoint("local", local_sim)
    external = endpoint("external", external_sim, kind="external")
    rule("default", local, external, is_default=True, use_kb_context=False)
    return {"entry": entry, "local": local, "external": external}


@pytest.fixture(scope="session")
def test_database_url(django_db_setup) -> str:
    """A DATABASE_URL naming pytest-django's test database, for child processes."""
    return url_with_database(settings.DATABASE_URL, settings.DATABASES["default"]["NAME"])


@pytest.fixture(scope="session")
def child_env(test_database_url) -> dict[str, str]:
    """The environment of this test run, for processes the tests start."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=test_database_url,
        REDIS_URL=settings.REDIS_URL,
        PYTHONUNBUFFERED="1",
        # Request log rows land within a fraction of a second, so tests that read them wait little.
        REQUEST_LOG_FLUSH_SECONDS="0.2",
    )
    return env


@pytest.fixture(scope="session")
def celery_worker(child_env, tmp_path_factory):
    """A real Celery worker process consuming every queue through the test Redis database."""
    from config.celery import app
    from devtools.workers import worker_start

    app.control.purge()  # tasks left by an earlier, interrupted run
    try:
        process = worker_start(
            hostname=f"test-{os.getpid()}@%h",
            env=child_env,
            log_path=tmp_path_factory.mktemp("celery") / "worker.log",
            cwd=settings.BASE_DIR,
        )
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield process
    stop_group(process)


@pytest.fixture(scope="session")
def asgi_server(child_env, tmp_path_factory):
    """The real ASGI application under daphne on a free port, on the test database, with
    production settings (DEBUG off, WhiteNoise serving collected static files) over plain
    HTTP, so a browser can use it too. Tests that write rows for it must use
    django_db(transaction=True)."""
    static_root = tmp_path_factory.mktemp("static")
    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "STATIC_ROOT": str(static_root),
        "LOG_LEVEL": "WARNING",
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=settings.BASE_DIR,
        env=env,
        check=True,
        timeout=120,
    )
    from benchmarks.servers import gateway  # the one place that starts a gateway and waits for it

    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(
                gateway(env=env, log_path=tmp_path_factory.mktemp("daphne") / "daphne.log")
            )
        except RuntimeError as exc:
            pytest.fail(f"daphne did not start: {exc}")
        yield running.url


@pytest.fixture(scope="session")
def local_sim():
    """A vLLM simulator in echo mode: the 'local' engine of routing and chat tests."""
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve",
        "acme/local",
        "--max-num-seqs",
        "8",
        "--time-to-first-token",
        "5",
        "--inter-token-latency",
        "5",
        "--mode",
        "echo",
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def external_sim():
    from tests.inference_ops.simulator_process import start_simulator

    sim = start_simulator(
        "serve", "acme/external", "--time-to-first-token", "5", "--inter-token-latency", "2"
    )
    yield sim
    sim.stop()


@pytest.fixture(autouse=True)
def _fresh_channel_layer():
    """Each test runs in an event loop of its own, and the Redis channel layer keeps asyncio locks:
    a socket a test left open holds its receive lock into the next test's loop, where the next
    consumer fails with "bound to a different event loop". A process serves one loop, so this is
    the tests' own matter: each test gets a layer of its own."""
    from channels.layers import channel_layers

    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _no_rows_of_earlier_tests():
    """The request log's and the KB misses' buffers start empty: what an earlier test's requests
    noted must not be written into this test's database by its flush (or the writer thread)."""
    from knowledge.misses import _writer as miss_rows
    from observability.requestlog import _writer as request_rows

    for writer in (request_rows, miss_rows):
        writer.discard()


@pytest.fixture(autouse=True)
def _fresh_routing_state():
    """Closed breakers, fresh rate and spend limits and a rebuilt rule snapshot and engine states
    for every test."""
    import redis as redis_client

    from inference_ops.engine_state import changed as engine_states_changed
    from routing.rules import rules_changed
    from spend.policy import limits_changed

    client = redis_client.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    # Breakers and rate-limit windows live in Redis and outlive a test's database.
    prefix = settings.REDIS_KEY_PREFIX
    for pattern in (
        f"{prefix}:breaker:*",
        f"{prefix}:chat:rate:*",
        f"{prefix}:login:failures:*",
        f"{prefix}:spend:*",
    ):
        for key in client.scan_iter(pattern):
            client.delete(key)
    rules_changed()
    limits_changed()
    engine_states_changed()
    yield
    rules_changed()
    limits_changed()
    engine_states_changed()
