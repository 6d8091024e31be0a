"""Which local processes `bench` measures the CPU of, read from the real /proc."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.cpu import cpu_delta, probe_for

pytestmark = pytest.mark.engines

# Stand-ins named like make run's processes: a devserver whose children are a web process
# listening on a port and a worker that spends some CPU.
FAKE = textwrap.dedent("""
    import socket, subprocess, sys, time
    role = sys.argv[1]
    if role == "devtools.devserver":
        web = subprocess.Popen(
            [sys.executable, __file__, "daphne"], stdout=subprocess.PIPE, text=True
        )
        subprocess.Popen([sys.executable, __file__, "celery", "worker"])
        print(web.stdout.readline().strip(), flush=True)
    elif role == "daphne":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        print(server.getsockname()[1], flush=True)
    else:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
    time.sleep(60)
""")


@pytest.fixture
def fake_tree(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)

    def start(*args):
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    tree = start("devtools.devserver")
    stranger = start("daphne")  # another checkout's web process on the same machine
    try:
        yield tree, int(tree.stdout.readline()), stranger
    finally:
        for process in (tree, stranger):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_by_default_it_measures_the_process_tree_that_serves_the_url(fake_tree):
    tree, port, stranger = fake_tree
    probe = probe_for(base_url=f"http://127.0.0.1:{port}/v1")
    assert probe.roots == (tree.pid,)
    before = probe.snapshot()
    time.sleep(0.5)
    after = probe.snapshot()
    kinds = {kind for kind, _, _ in after.values()}
    assert kinds == {"other", "web", "worker"}
    assert stranger.pid not in {pid for pid, _ in after}
    delta = cpu_delta(before=before, after=after, requests=4)
    assert set(delta["cpu_ms_per_request"]) == {"other", "web", "worker"}
    assert delta["gateway_cpu_ms_per_request"] is not None and delta["exited"] == 0


def test_a_port_served_by_something_else_and_a_remote_url_measure_nothing(fake_tree):
    assert probe_for(base_url="http://192.0.2.1:8000/v1") is None
    assert probe_for(base_url="http://localhost:9/v1") is None  # no listener at all
    engine = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = engine.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        engine_port = int(line.split(" port ")[1].split()[0])
        assert probe_for(base_url=f"http://127.0.0.1:{engine_port}/v1") is None
    finally:
        engine.kill()
        engine.wait(timeout=10)


def test_explicit_pids_are_measured_as_given(fake_tree):
    _tree, _, stranger = fake_tree
    probe = probe_for(base_url="http://192.0.2.1:8000/v1", pids=[stranger.pid])
    assert probe.roots == (stranger.pid,)
    assert [kind for kind, _, _ in probe.snapshot().values()] == ["web"]
