import pytest

pytestmark = pytest.mark.django_db


def test_the_admin_login_page_renders(client):
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_the_admin_requires_login(client):
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_static_files_are_served_by_whitenoise(client):
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")


def test_the_chat_page_asks_anonymous_visitors_to_log_in(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.get("/accounts/login/").status_code == 200


def test_the_demo_data_loads_once_and_answers_directly(db, capsys, settings, tmp_path):
    from django.core.management import call_command

    settings.VAR_DIR = tmp_path  # the admin password file of `make run` stays untouched

    from knowledge.models import Entry
    from knowledge.selectors import direct_answer

    call_command("seed_demo")
    out = capsys.readouterr().out
    assert "admin login: admin / " in out
    assert "demo knowledge base: 10 created" in out
    assert (
        "demo routing rules: local model by name, translation and analysis, "
        "long-form writing, default" in out
    )
    assert direct_answer("I want to cancel my order").hit
    Entry.objects.filter(question="What is LoRA?").update(answer="edited by a curator")
    call_command("seed_demo")
    assert "demo knowledge base" not in capsys.readouterr().out
    assert Entry.objects.get(question="What is LoRA?").answer == "edited by a curator"


@pytest.mark.processes
def test_collected_chat_modules_import_each_other_by_their_hashed_names(child_env, tmp_path):
    """Django hashes the entry point the template names; each import inside it must name a hashed
    file too, or a browser could pair a new boot.js with an old module cached from the last
    deploy."""
    import re
    import subprocess
    import sys

    from config.settings import BASE_DIR

    env = {**child_env, "DEBUG": "false", "SECRET_KEY": "x" * 50, "STATIC_ROOT": str(tmp_path)}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=BASE_DIR,
        env=env,
        check=True,
        timeout=120,
    )
    modules = tmp_path / "chat" / "chat"
    (boot,) = [p for p in modules.glob("boot.*.js") if not p.name.endswith((".gz", ".br"))]
    imports = re.findall(r'from\s+"(\./[^"]+)"', boot.read_text())
    assert imports and all(re.fullmatch(r"\./\w+\.[0-9a-f]{12}\.js", name) for name in imports), (
        imports
    )
    assert all((modules / name[2:]).exists() for name in imports)
