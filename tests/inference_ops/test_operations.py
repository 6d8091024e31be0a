"""The operator's tools: the admin pages and `manage.py engine`."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference_ops.models import EngineProcess, LoraAdapter
from tests.inference_ops.test_supervisor import make_engine, stop_engines_afterwards  # noqa: F401

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
        response = staff.post("/admin/inference_ops/engineprocess/",
                              {"action": "restart", "_selected_action": [engine.pk]})
    assert response.status_code == 302
    assert len(callbacks) == 1


def test_adapter_errors_are_shown_to_the_admin(staff):
    engine = make_engine(enable_lora=True)
    adapter = LoraAdapter.objects.create(engine=engine, name="legal", path="/a", static=False)
    response = staff.post("/admin/inference_ops/loraadapter/", {"action": "load", "_selected_action": [adapter.pk]},
                          follow=True)
    assert "does not allow runtime LoRA updates" in response.content.decode()
    assert EngineProcess.objects.count() == 1
