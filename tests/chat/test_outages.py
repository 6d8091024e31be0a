"""Redis or PostgreSQL gone: a clear 503 with Retry-After (an `unavailable` frame on the socket),
and service back by itself when the dependency returns, without restarting the web process.

Real processes: a gateway daphne of its own, on a Redis server of its own (started, stopped and
started again here) and on the test database through a TCP proxy (killed to cut PostgreSQL off,
started again to restore it), so the servers the other tests share are never touched.
"""

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.test import Client

from chat.models import ChatSession, Message
from core.processes import free_port
from core.processes import stop_group as stop_process_group
from spend.ledger import LEASE_IDLE
from tests.support.personas import staff_user
from tests.support.processes import BASE_DIR, http_get, url_with_database

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

METRICS_TOKEN = "outages-metrics-token"
QUESTION = "How do I reset my password?"  # the KB answers it: no rules or engines involved


class Service:
    """A process on a fixed port that a test stops and starts again."""

    def __init__(
        self, name: str, command: list[str], port: int, log_dir: Path, env: dict | None = None
    ):
        self.name, self.command, self.port, self.log_dir, self.env = (
            name,
            command,
            port,
            log_dir,
            env,
        )
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"{self.name}.{self.starts}.log", "wb")  # noqa: SIM115 - the process keeps it
        self.process = subprocess.Popen(
            self.command,
            cwd=BASE_DIR,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start: {self.log()}") from None
                time.sleep(0.05)

    def ensure_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()

    def kill(self) -> None:
        """Gone at once, every connection cut, as a crashed server or a network partition."""
        stop_process_group(self.process, timeout=0)

    def log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob(f"{self.name}.*.log"))
        )


@pytest.fixture(scope="module")
def outage_gateway(child_env, test_database_url, tmp_path_factory):
    """A daphne gateway whose Redis and PostgreSQL this module may take away."""
    logs = tmp_path_factory.mktemp("outages")
    redis_port, pg_port, web_port = free_port(), free_port(), free_port()
    redis = Service(
        "redis",
        [
            "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(logs),
        ],
        redis_port,
        logs,
    )
    database = settings.DATABASES["default"]
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or "5432"
    target = (
        str(Path(host) / f".s.PGSQL.{port}") if host.startswith("/") else f"{host}:{port}"
    )  # unix socket or TCP
    postgres = Service(
        "pgproxy",
        [sys.executable, "tests/support/tcp_proxy.py", str(pg_port), target],
        pg_port,
        logs,
    )
    redis.start()
    postgres.start()
    user = database["USER"] or "postgres"
    password = f":{database['PASSWORD']}" if database["PASSWORD"] else ""
    database_url = url_with_database(
        f"postgresql://{user}{password}@127.0.0.1:{pg_port}/x", database["NAME"]
    )
    env = {
        **child_env,
        "DEBUG": "false",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
        "STATIC_ROOT": str(logs / "static"),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "DATABASE_URL": database_url,
        "DATABASE_POOL_TIMEOUT": "2",
        "DATABASE_CONNECT_TIMEOUT": "2",
        "REDIS_TIMEOUT": "2",
        "API_KEY_CACHE_SECONDS": "0",
        "METRICS_TOKEN": METRICS_TOKEN,
    }
    web = Service(
        "daphne",
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(web_port),
            "config.asgi:application",
        ],
        web_port,
        logs,
        env=env,
    )
    # The same gateway with the per-user limits failing open (LIMITS_ON_REDIS_OUTAGE).
    open_port = free_port()
    open_web = Service(
        "daphne-open",
        [*web.command[:-2], str(open_port), "config.asgi:application"],
        open_port,
        logs,
        env={**env, "LIMITS_ON_REDIS_OUTAGE": "open"},
    )
    web.start()
    open_web.start()
    url = f"http://127.0.0.1:{web_port}"
    _wait(lambda: http_get(f"{url}/healthz")[0] == 200, 60, web)
    _wait(lambda: http_get(f"http://127.0.0.1:{open_port}/healthz")[0] == 200, 60, open_web)
    yield {
        "url": url,
        "redis": redis,
        "postgres": postgres,
        "web": web,
        "open_url": f"http://127.0.0.1:{open_port}",
    }
    for service in (web, open_web, redis, postgres):
        stop_process_group(service.process)


def _wait(condition, seconds: float, service: Service) -> float:
    """Seconds until `condition()` holds (polled), or a failure with the service's log."""
    started = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > seconds:
            pytest.fail(f"not within {seconds} s; {service.name} log:\n{service.log()[-4000:]}")
        time.sleep(0.2)


def _post(url: str, body: dict, key: str) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def _ask(gateway, key) -> tuple[int, dict, dict]:
    return _post(
        f"{gateway['url']}/v1/chat/completions",
        {"model": "auto", "messages": [{"role": "user", "content": QUESTION}]},
        key,
    )


def _assert_unavailable(status, headers, body, *, names: str, shape: set[str]):
    assert status == 503, body
    assert headers["Retry-After"] == "5"
    assert set(body["error"]) == shape
    assert body["error"]["code"] == "unavailable" and names in body["error"]["message"]


OPENAI_SHAPE = {"message", "type", "param", "code"}
GATEWAY_SHAPE = {"code", "message", "fields"}


@pytest.fixture
def kb(db):
    from knowledge.services.entries import entry_create

    return entry_create(question=QUESTION, answer="Use **Forgot password**.", embed="sync")


async def _socket(gateway, user):
    client = Client()
    await sync_to_async(client.force_login)(user)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    ws = await session.ws_connect(
        f"{gateway['url']}/ws/chat/",
        headers={
            "Cookie": f"sessionid={client.cookies['sessionid'].value}",
            "Origin": gateway["url"],
        },
    )
    return session, ws


async def _socket_ask(ws) -> list[dict]:
    await ws.send_json({"type": "message", "session": None, "content": QUESTION})
    frames = []
    while True:
        frame = await asyncio.wait_for(ws.receive_json(), 30)
        frames.append(frame)
        if frame["type"] in ("done", "error"):
            return frames


@pytest.mark.parametrize(("service", "names"), [("redis", "Redis"), ("postgres", "database")])
async def test_a_dependency_gone_is_a_503_and_an_unavailable_frame_and_service_returns_with_it(
    outage_gateway, kb, alice, alice_key, service, names
):
    """Redis stopped (and started again empty, as after a restart without persistence), or
    PostgreSQL cut off at its proxy (and restored)."""
    gateway, dependency = outage_gateway, outage_gateway[service]
    session = await ChatSession.objects.acreate(user=alice)
    messages_url = f"{gateway['url']}/api/chat/sessions/{session.pk}/messages/"
    http, ws = await _socket(gateway, alice)
    try:
        assert (await sync_to_async(_ask)(gateway, alice_key))[0] == 200
        assert (await _socket_ask(ws))[-1]["type"] == "done"
        stored = await Message.objects.acount()

        dependency.kill()
        _assert_unavailable(
            *await sync_to_async(_ask)(gateway, alice_key), names=names, shape=OPENAI_SHAPE
        )
        _assert_unavailable(
            *await sync_to_async(_post)(messages_url, {"content": QUESTION}, alice_key),
            names=names,
            shape=GATEWAY_SHAPE,
        )
        frame = (await _socket_ask(ws))[-1]
        assert (
            frame["type"] == "error"
            and frame["code"] == "unavailable"
            and names in frame["message"]
        )
        assert frame["retry_after"] == 5
        assert await Message.objects.acount() == stored  # nothing stored half-way
        if service == "postgres":  # a page reads the session from the database
            status, headers, page = await sync_to_async(_page)(gateway, alice)
            assert (status, headers.get("Retry-After")) == (503, "5")
            assert "The database is unavailable right now" in page

        dependency.start()
        # Back by itself, in the same process, once the dependency answers again.
        await sync_to_async(_wait)(lambda: _ask(gateway, alice_key)[0] == 200, 30, gateway["web"])
        status, _, body = await sync_to_async(_post)(messages_url, {"content": QUESTION}, alice_key)
        assert status == 201, body
        assert (await _socket_ask(ws))[-1]["type"] == "done"  # the same socket, still open
        assert (
            gateway["web"].starts == 1 and gateway["web"].process.poll() is None
        )  # never restarted
    finally:
        await ws.close()
        await http.close()
        dependency.ensure_running()  # for the next test, whatever happened in this one


def _page(gateway, user) -> tuple[int, dict, str]:
    """The chat page as a logged-in browser asks for it."""
    client = Client()
    client.force_login(user)
    request = urllib.request.Request(
        f"{gateway['url']}/", headers={"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


async def _ops_hello(gateway, user) -> str:
    """Open the staff operations feed (it joins a channel-layer group in Redis): its first frame's
    type, or how it failed."""
    client = Client()
    await sync_to_async(client.force_login)(user)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.ws_connect(
                f"{gateway['url']}/ws/ops/",
                headers={
                    "Cookie": f"sessionid={client.cookies['sessionid'].value}",
                    "Origin": gateway["url"],
                },
            ) as ws:
                message = await ws.receive(timeout=10)
                return (
                    json.loads(message.data)["type"]
                    if message.type == aiohttp.WSMsgType.TEXT
                    else "closed"
                )
        except aiohttp.WSServerHandshakeError as exc:
            return f"refused {exc.status}"


async def test_the_operations_feed_comes_back_after_redis_restarts(outage_gateway):
    gateway, redis = outage_gateway, outage_gateway["redis"]
    staff = await sync_to_async(staff_user)("opsy", perms=("inference_ops.view_engineprocess",))
    try:
        assert await _ops_hello(gateway, staff) == "hello"
        redis.kill()
        assert (
            await _ops_hello(gateway, staff) != "hello"
        )  # no group to join: no feed, and no crash
        redis.start()
        await sync_to_async(_wait)(
            lambda: async_to_sync(_ops_hello)(gateway, staff) == "hello", 15, gateway["web"]
        )
        assert gateway["web"].process.poll() is None  # the same process: no crash loop, no restart
    finally:
        redis.ensure_running()


def _header(headers: dict, name: str) -> str | None:
    """A header by name in any case (daphne writes them capitalised)."""
    return {key.lower(): value for key, value in headers.items()}.get(name)


def _publish_changes(redis_port: int) -> None:
    """Tell these gateways that the rules and the limits changed, as a save would in their Redis
    (the test's own saves tell the test's Redis)."""
    import uuid

    import redis as redis_client

    from routing.rules import VERSION_KEY as RULES
    from spend.policy import VERSION_KEY as LIMITS

    client = redis_client.Redis(port=redis_port, socket_timeout=2)
    for key in (RULES, LIMITS):
        client.set(f"{settings.REDIS_KEY_PREFIX}:1:{key}", json.dumps(uuid.uuid4().hex))


def _unchecked(url: str) -> dict[str, float]:
    """gateway_spend_unchecked_total by outcome, from the gateway's /metrics."""
    request = urllib.request.Request(
        f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("gateway_spend_unchecked_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


def test_limits_fail_closed_unless_set_open_and_either_way_it_shows(
    outage_gateway, product, alice, alice_key
):
    """Redis gone: a key with spend limits is refused (503, retryable) by default; a gateway set
    to LIMITS_ON_REDIS_OUTAGE=open answers it uncounted. Both say so in /metrics."""
    from chat.models import ApiKey
    from spend.models import Limit

    Limit.objects.create(
        api_key=ApiKey.objects.get(user=alice), requests_per_minute=100, tokens_per_minute=10**6
    )
    closed, opened = outage_gateway, {**outage_gateway, "url": outage_gateway["open_url"]}
    generated = {"model": "auto", "messages": [{"role": "user", "content": "Write a haiku"}]}
    redis = outage_gateway["redis"]
    _publish_changes(redis.port)
    try:
        for gateway in (closed, opened):
            # (An earlier test's Redis restart may leave a dead pooled connection to retry once.)
            url = f"{gateway['url']}/v1/chat/completions"
            _wait(lambda url=url: _post(url, generated, alice_key)[0] == 200, 30, redis)
            status, headers, body = _post(url, generated, alice_key)
            assert status == 200 and _header(headers, "x-ratelimit-remaining-requests"), body
        # A process admits against the share of each limit it leased before (counted already),
        # even with Redis gone; idle, the shares go back, and an outage then meets the setting.
        time.sleep(5 * LEASE_IDLE)  # a sweep runs every LEASE_IDLE: room for a busy machine

        redis.kill()
        status, headers, body = _post(f"{closed['url']}/v1/chat/completions", generated, alice_key)
        assert (status, headers["Retry-After"]) == (503, "5"), body
        status, headers, body = _post(f"{opened['url']}/v1/chat/completions", generated, alice_key)
        assert status == 200, body
        assert body["choices"][0]["message"]["content"]
        assert _header(headers, "x-ratelimit-remaining-requests") is None  # nothing counted
        assert _unchecked(closed["url"]).get("closed", 0) >= 1
        # The admission and the spend limits each let it through, uncounted.
        assert _unchecked(opened["url"]).get("open", 0) >= 2
    finally:
        redis.ensure_running()
