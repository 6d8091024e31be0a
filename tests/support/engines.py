"""Engine rows and their simulator processes, for the supervision tests: an engine row on a free
port, the processes found on a port, the stopping of every engine a test started, and checks run
until an engine reaches a state."""

import psutil
import pytest

from core.processes import free_port
from inference_ops import engine_processes, supervisor
from inference_ops.models import EngineProcess, ModelEndpoint
from tests.support.polling import wait_until


def unclaimed_port() -> int:
    """A free loopback port that no engine row names yet. A row holds its port before any process
    binds it, and the system may hand out the same free port twice in a row (it did, beside
    another test run): two rows on one port break the engines' unique (host, port)."""
    claimed = set(EngineProcess.objects.values_list("port", flat=True))
    while (port := free_port()) in claimed:
        pass
    return port


def make_engine(name="local-sim", *, first_token_timeout=30.0, **fields) -> EngineProcess:
    """A simulator engine's row and its endpoint's (`first_token_timeout` is the endpoint's)."""
    port = fields.pop("port", None) or unclaimed_port()
    endpoint = ModelEndpoint.objects.create(
        name=name,
        kind="vllm",
        base_url=f"http://127.0.0.1:{port}/v1",
        model="acme/base",
        first_token_timeout=first_token_timeout,
    )
    defaults = dict(
        kind="simulator",
        model="acme/base",
        port=port,
        startup_timeout=30,
        stop_timeout=5,
        extra_args=["--time-to-first-token", "5", "--inter-token-latency", "2"],
    )
    return EngineProcess.objects.create(name=name, endpoint=endpoint, **{**defaults, **fields})


def processes_on(port: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if (
            "inference_ops.simulator" in cmdline
            and str(port) in cmdline
            and process.status() != "zombie"
        ):
            found.append(process)
    return found


@pytest.fixture(autouse=True)
def stop_engines_afterwards(request):
    yield
    if request.node.get_closest_marker("django_db") is None:
        return
    for engine in EngineProcess.objects.all():
        if engine.pid:
            engine_processes.terminate_session(engine.pid, 2)
        for process in processes_on(engine.port):
            process.kill()


def check_until(engine, wanted, timeout=30):
    """Run checks (and the restarts they ask for) until the engine reaches `wanted`
    with a process other than the one it had (for "ready")."""

    def reached():
        if supervisor.engine_check(engine_id=engine.pk) == "restart":
            supervisor.engine_start(engine_id=engine.pk, reason="automatic restart")
        current = EngineProcess.objects.get(pk=engine.pk)
        if wanted == "ready" and current.pid == engine.pid:
            return None
        return current if current.status == wanted else None

    return wait_until(reached, timeout=timeout, step=0.2)
