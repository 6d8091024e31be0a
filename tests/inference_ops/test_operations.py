"""The operator's tools: the admin pages and `manage.py engine`."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference_ops.models import EngineProcess, LoraAdapter
from tests.support.engines import make_engine, stop_engines_afterwards  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


def test_the_engine_command_starts_reports_and_stops(capsys):
    engine = make_engine()
    call_command("engine", "start", engine.name)
    assert f"{engine.name}: ready (ready); desired running; pid " in capsys.readouterr().out
    call_command("engine", "status")
    out = capsys.readouterr().out
    assert "running=0" in out or "ready" in out
    call_command("engine", "stop", engine.name)
    assert f"{engine.name}: stopped" in capsys.readouterr().out


def test_the_engine_command_names_an_unknown_engine():
    make_engine(name="alpha")
    with pytest.raises(CommandError, match="no engine named 'beta' \\(known: alpha\\)"):
        call_command("engine", "start", "beta")


def test_the_engine_page_shows_status_command_line_and_log(staff):
    engine = make_engine()
    call_command("engine", "start", engine.name)
    html = staff.get(f"/admin/inference_ops/engineprocess/{engine.pk}/change/").content.decode()
    assert "inference_ops.simulator serve acme/base" in html
    assert "simulator ready on" in html  # the log tail
    listing = staff.get("/admin/inference_ops/engineprocess/").content.decode()
    assert "Ready" in listing or "ready" in listing


def test_engine_actions_are_queued_after_commit(staff, django_capture_on_commit_callbacks):
    engine = make_engine()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = staff.post(
            "/admin/inference_ops/engineprocess/",
            {"action": "restart", "_selected_action": [engine.pk]},
        )
    assert response.status_code == 302
    assert len(callbacks) == 1


def test_adapter_errors_are_shown_to_the_admin(staff):
    engine = make_engine(enable_lora=True)
    adapter = LoraAdapter.objects.create(engine=engine, name="legal", path="/a", static=False)
    response = staff.post(
        "/admin/inference_ops/loraadapter/",
        {"action": "load", "_selected_action": [adapter.pk]},
        follow=True,
    )
    assert "does not allow runtime LoRA updates" in response.content.decode()
    assert EngineProcess.objects.count() == 1


def test_loading_an_adapter_is_queued_for_the_engines_host(
    staff, django_capture_on_commit_callbacks
):
    """The admin's request does not call the engine: a load may take many seconds, and only the
    engine's own host is sure to reach it (its `bind_host` may be 0.0.0.0 there)."""
    engine = make_engine(enable_lora=True, runtime_lora_updating=True, host="gpu-1")
    adapter = LoraAdapter.objects.create(
        engine=engine, name="legal", path="/adapters/legal", static=False
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = staff.post(
            "/admin/inference_ops/loraadapter/",
            {"action": "load", "_selected_action": [adapter.pk]},
            follow=True,
        )
    assert "Legal: load queued on ops.gpu-1" in response.content.decode()  # the admin capitalizes
    assert len(callbacks) == 1
    assert LoraAdapter.objects.get(pk=adapter.pk).state == adapter.state  # nothing called yet


@pytest.mark.django_db(transaction=True)
def test_the_engines_worker_loads_and_unloads_the_adapter(celery_worker):
    from inference_ops import supervisor
    from inference_ops.tasks import adapter_load_task, adapter_unload_task

    engine = supervisor.engine_start(
        engine_id=make_engine(enable_lora=True, runtime_lora_updating=True).pk
    )
    adapter = LoraAdapter.objects.create(
        engine=engine, name="legal", path="/adapters/legal", static=False
    )
    assert (
        adapter_load_task.apply_async((adapter.pk,), queue=engine.queue).get(timeout=60) == "loaded"
    )
    assert LoraAdapter.objects.get(pk=adapter.pk).state == "loaded"
    failed = adapter_load_task.apply_async((adapter.pk,), queue=engine.queue).get(timeout=60)
    assert failed.startswith(
        "failed: loading legal failed: HTTP 400"
    )  # the engine's own refusal, kept
    assert "already" in LoraAdapter.objects.get(pk=adapter.pk).error
    assert (
        adapter_unload_task.apply_async((adapter.pk,), queue=engine.queue).get(timeout=60)
        == "unloaded"
    )
    assert LoraAdapter.objects.get(pk=adapter.pk).state == "unloaded"
