import os
import secrets
import subprocess
import sys

import pytest

from config.settings import BASE_DIR
from core.processes import free_port
from devtools.embedded import redis_answers


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def production_env(child_env) -> dict[str, str]:
    return {
        **child_env,
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "answers.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://answers.example.com",
        "SECURE_SSL_REDIRECT": "true",
    }


@pytest.mark.processes
def test_check_deploy_is_clean_in_a_production_environment(production_env):
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=production_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DEBUG", "maybe", "Environment variable DEBUG must be a boolean"),
        (
            "DATABASE_POOL_SIZE",
            "ten",
            "Environment variable DATABASE_POOL_SIZE must be a whole number",
        ),
        (
            "REDIS_URL",
            "http://localhost:6379",
            "Environment variable REDIS_URL must be a URL with scheme redis",
        ),
        (
            "DATABASE_URL",
            "mysql://db/x",
            "Environment variable DATABASE_URL must be a URL with scheme postgres",
        ),
        (
            "CSRF_TRUSTED_ORIGINS",
            "answers.example.com",
            "Environment variable CSRF_TRUSTED_ORIGINS must be a URL",
        ),
        (
            "ADMISSION_KV_THRESHOLD",
            "90",
            "Environment variable ADMISSION_KV_THRESHOLD must be at most 1.0",
        ),
        (
            "LOG_LEVEL",
            "LOUD",
            "Environment variable LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR",
        ),
    ],
)
def test_a_malformed_variable_stops_start_up_naming_it(production_env, variable, value, message):
    result = _manage("check", env={**production_env, variable: value})
    assert result.returncode == 2
    assert f"Configuration error: {message}" in result.stderr
    assert "Traceback" not in result.stderr


def test_production_refuses_to_start_without_a_secret_key(production_env):
    env = {key: value for key, value in production_env.items() if key != "SECRET_KEY"}
    result = _manage("check", env=env)
    assert result.returncode == 2
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_a_password_in_a_bad_url_is_not_printed(production_env):
    result = _manage("check", env={**production_env, "DATABASE_URL": "mysql://user:hunter2@db/x"})
    assert result.returncode == 2
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize("variable", ["DATABASE_URL", "REDIS_URL"])
def test_production_never_starts_an_embedded_server_of_its_own(production_env, variable, tmp_path):
    """Without the variable and with DEBUG off, start-up stops; with DEBUG on, development gets
    the embedded server under var/ (here a fresh one, which is not started)."""
    env = {key: value for key, value in production_env.items() if key != variable}
    result = _manage("check", env={**env, "VAR_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert f"{variable} must be set when DEBUG is off" in result.stderr
    assert not (tmp_path / "pgdata").exists() and not (tmp_path / "redis").exists()


_IMPORT = """
import os
from django.core.exceptions import ImproperlyConfigured
try:
    import config.settings
    print("imported")
except ImproperlyConfigured as exc:
    print(exc)
print("PROMETHEUS_MULTIPROC_DIR" in os.environ)
"""


@pytest.mark.parametrize("urls", [False, True], ids=["without URLs", "with URLs"])
def test_importing_the_settings_starts_no_server_and_makes_nothing(tmp_path, urls):
    """Importing the settings reads the environment and nothing else, in development too: the
    embedded servers, the development key and the folders are the entry points' to make
    (config.bootstrap)."""
    var = tmp_path / "var"
    redis_port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DEBUG": "true",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "VAR_DIR": str(var),
        "EMBEDDED_REDIS_PORT": str(redis_port),
    }
    if urls:
        env.update(DATABASE_URL="postgresql://127.0.0.1:1/x", REDIS_URL="redis://127.0.0.1:1/0")
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    said, named_metrics = result.stdout.splitlines()
    if urls:
        assert said == "imported"
    else:
        assert "DATABASE_URL must be set (with DEBUG on, manage.py and make run start" in said
    assert named_metrics == "False"
    assert not var.exists()
    assert not redis_answers("127.0.0.1", redis_port)
