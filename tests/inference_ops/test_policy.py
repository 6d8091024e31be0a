"""What configuration rows may ask of the host: an endpoint's key variable, an engine's
environment, arguments and model, and who may edit them."""

import json
import logging
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError

from inference_ops import engine_command, supervisor
from inference_ops.endpoint_calls import EndpointConfig
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.models import EngineEvent, LoraAdapter, ModelEndpoint
from tests.support.engines import make_engine, processes_on, stop_engines_afterwards  # noqa: F401

pytestmark = pytest.mark.django_db


def external(**fields) -> ModelEndpoint:
    return ModelEndpoint(
        name="ext", kind="external", base_url="https://llm.example.com/v1", model="big", **fields
    )


def field_errors(instance) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        instance.full_clean()
    return caught.value.message_dict


# --- The variable an endpoint's key comes from ----------------------------------------------------


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "REDIS_URL", "HOME"])
def test_an_endpoint_may_not_name_the_gateways_own_variables_as_its_key(name):
    errors = field_errors(external(api_key_env=name))
    assert "GW_KEY_" in errors["api_key_env"][0]


def test_a_key_variable_with_the_prefix_is_sent(monkeypatch):
    monkeypatch.setenv("GW_KEY_ACME", "sk-acme")
    endpoint = external(api_key_env="GW_KEY_ACME")
    endpoint.full_clean()
    assert EndpointConfig.from_endpoint(endpoint).api_key == "sk-acme"


def test_the_key_variable_the_operator_configured_stays_allowed(settings, monkeypatch):
    settings.EXTERNAL_LLM_API_KEY_ENV = "OPENAI_API_KEY"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    endpoint = external(api_key_env="OPENAI_API_KEY")
    endpoint.full_clean()
    assert endpoint.api_key == "sk-openai"
    settings.ENDPOINT_KEY_ENV_NAMES = ["ANTHROPIC_API_KEY"]
    external(api_key_env="ANTHROPIC_API_KEY").full_clean()


def test_even_the_operator_cannot_allow_the_secret_key(settings):
    settings.ENDPOINT_KEY_ENV_NAMES = ["SECRET_KEY"]
    assert "api_key_env" in field_errors(external(api_key_env="SECRET_KEY"))


def test_a_row_written_before_the_rule_sends_no_key_and_says_why(monkeypatch, caplog):
    monkeypatch.setenv("DATABASE_URL", "postgres://gateway:hunter2@db/gateway")
    endpoint = ModelEndpoint.objects.create(
        name="old",
        kind="external",
        base_url="https://evil.example/v1",
        model="m",
        api_key_env="DATABASE_URL",
    )
    with caplog.at_level(logging.ERROR, logger="inference_ops.models"):
        config = EndpointConfig.from_endpoint(endpoint)
    assert config.api_key == ""
    assert "hunter2" not in repr(config)
    assert "endpoint old: DATABASE_URL may not hold an endpoint key" in caplog.text


def test_the_admin_form_names_the_rule(superuser_client):
    response = superuser_client.post(
        "/admin/inference_ops/modelendpoint/add/",
        {
            "name": "evil",
            "kind": "external",
            "active": "on",
            "base_url": "https://evil.example/v1",
            "api_key_env": "SECRET_KEY",
            "model": "m",
            "context_window": 4096,
            "max_concurrency": 64,
            "connect_timeout": 3,
            "first_token_timeout": 30,
            "idle_timeout": 15,
            "total_timeout": 300,
        },
    )
    assert response.status_code == 200
    assert "may not hold an endpoint key" in response.content.decode()
    assert not ModelEndpoint.objects.filter(name="evil").exists()


# --- What an engine row may run -------------------------------------------------------------------


def test_an_engine_gets_a_clean_environment_without_the_gateways_secrets(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "django-secret")
    monkeypatch.setenv("DATABASE_URL", "postgres://gateway:hunter2@db/gateway")
    monkeypatch.setenv("GW_KEY_ACME", "sk-acme")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    engine = make_engine(environment={"HF_HOME": "/data/hf"})
    env = engine_command.environment(engine)
    assert not {"SECRET_KEY", "DATABASE_URL", "GW_KEY_ACME"} & set(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["HF_HOME"] == "/data/hf" and env["PATH"]


def test_a_running_engine_process_does_not_see_the_gateways_secrets(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "django-secret")
    monkeypatch.setenv("GW_KEY_ACME", "sk-acme")
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    environ = Path(f"/proc/{engine.pid}/environ").read_bytes().split(b"\0")
    names = {item.split(b"=", 1)[0] for item in environ if item}
    assert (
        b"SECRET_KEY" not in names and b"GW_KEY_ACME" not in names and b"DATABASE_URL" not in names
    )
    assert b"PATH" in names


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "BASH_ENV",
        "SECRET_KEY",
        "HF_ENDPOINT",
        "no spaces allowed",
    ],
)
def test_an_engine_environment_refuses_what_would_run_other_code(name):
    engine = make_engine(environment={name: "/tmp/x"})
    errors = field_errors(engine)
    assert name in errors["environment"][0]


@pytest.mark.parametrize(
    "kind,args",
    [
        ("vllm", ["--trust-remote-code"]),
        ("vllm", ["--middleware", "evil.Middleware"]),
        ("vllm", ["--tool-parser-plugin", "/tmp/evil.py"]),
        ("vllm", ["--host", "0.0.0.0"]),
        ("simulator", ["stray-positional"]),
        ("cpu", ["--path", "/"]),
        ("cpu", ["--slot-save-path", "/etc"]),
        ("cpu", ["--log-file", "/etc/passwd"]),
    ],
)
def test_extra_arguments_outside_the_kinds_allow_list_are_refused(kind, args):
    engine = make_engine(kind=kind, extra_args=args)
    errors = field_errors(engine)
    assert "extra_args" in errors and "not allowed" in errors["extra_args"][0]


@pytest.mark.parametrize(
    "kind,args",
    [
        ("simulator", ["--time-to-first-token", "5", "--inter-token-latency", "2", "--seed", "1"]),
        ("simulator", ["--max-num-seqs", "0"]),
        (
            "vllm",
            [
                "--seed",
                "1",
                "--enforce-eager",
                "--kv-cache-dtype=fp8",
                "--chat-template",
                "{files}/t.jinja",
            ],
        ),
        (
            "cpu",
            [
                "--threads",
                "1",
                "--seed",
                7,
                "--chat-template-file",
                "{files}/t.jinja",
                "--temp",
                "-1",
            ],
        ),
    ],
)
def test_the_arguments_in_use_today_are_allowed(settings, kind, args):
    settings.ENGINE_FILES_DIR = "/srv/engine-files"
    args = [a.format(files=settings.ENGINE_FILES_DIR) if isinstance(a, str) else a for a in args]
    make_engine(kind=kind, extra_args=args).full_clean()


# --- Flags and variables that reach the host's files or load code ---------------------------------


FILES = "/srv/engine-files"


@pytest.mark.parametrize(
    "kind,args",
    [
        ("vllm", ["--chat-template", "/etc/passwd"]),
        ("vllm", ["--chat-template=/home/gpu/.ssh/id_ed25519"]),
        ("vllm", ["--chat-template", "t.jinja"]),
        ("vllm", ["--chat-template", f"{FILES}/../../etc/shadow"]),
        ("simulator", ["--chat-template", "/etc/passwd"]),
        ("cpu", ["--chat-template-file", "/etc/passwd"]),
        ("cpu", ["--chat-template-file=/proc/self/environ"]),
        ("vllm", ["--download-dir", "/etc/cron.d"]),
        ("vllm", ["--download-dir", "/srv/engine-files-and-more"]),
        ("vllm", ["--tokenizer", "/root/tokenizer"]),
        ("vllm", ["--tokenizer", "../../etc"]),
        ("vllm", ["--tokenizer", "~/models/tok"]),
        ("vllm", ["--generation-config", "/etc"]),
        ("vllm", ["--enforce-eager", "--generation-config=/var/lib/secrets"]),
    ],
)
def test_a_flag_naming_a_host_path_outside_the_engine_files_folder_is_refused(settings, kind, args):
    settings.ENGINE_FILES_DIR = FILES
    errors = field_errors(make_engine(kind=kind, extra_args=args))
    assert "extra_args" in errors
    assert any(FILES in message for message in errors["extra_args"]), errors


@pytest.mark.parametrize(
    "kind,args",
    [
        ("vllm", ["--chat-template", f"{FILES}/qwen.jinja"]),
        ("vllm", ["--chat-template=" + FILES + "/templates/qwen.jinja"]),
        ("vllm", ["--chat-template", "{% for m in messages %}{{ m.content }}\n{% endfor %}"]),
        ("vllm", ["--download-dir", f"{FILES}/hf"]),
        ("vllm", ["--download-dir", FILES]),
        ("vllm", ["--tokenizer", "Qwen/Qwen2.5-7B-Instruct"]),
        ("vllm", ["--tokenizer", "gpt2"]),
        ("vllm", ["--tokenizer", f"{FILES}/tokenizer"]),
        ("vllm", ["--generation-config", "vllm"]),
        ("vllm", ["--generation-config", "auto"]),
        ("vllm", ["--generation-config", f"{FILES}/generation"]),
        ("cpu", ["--chat-template", "chatml"]),
        ("cpu", ["--chat-template-file", f"{FILES}/t.jinja"]),
    ],
)
def test_paths_inside_the_folder_names_and_inline_templates_are_allowed(settings, kind, args):
    settings.ENGINE_FILES_DIR = FILES
    make_engine(kind=kind, extra_args=args).full_clean()


def test_the_bundled_question_answer_template_is_allowed_but_not_as_a_download_folder(settings):
    from inference_ops import cpu_engine

    settings.ENGINE_FILES_DIR = FILES
    make_engine(kind="cpu", extra_args=cpu_engine.qa_arguments()).full_clean()
    download_into_the_code = ["--download-dir", str(cpu_engine.QA_TEMPLATE.parent)]
    errors = field_errors(make_engine(name="other", kind="vllm", extra_args=download_into_the_code))
    assert "--download-dir" in errors["extra_args"][0]


@pytest.mark.parametrize("template", ["", "qa", "/opt/templates/mine.jinja"])
def test_the_demos_engine_rows_pass_the_policy(settings, template):
    from inference_ops import demo

    settings.ENGINE_FILES_DIR = FILES
    settings.LOCAL_VLLM_URL, settings.CPU_ENGINE_MODEL, settings.CPU_ENGINE_CHAT_TEMPLATE = (
        None,
        "",
        template,
    )
    settings.LOCAL_ENGINE = "cpu"
    demo.demo_engine_ensure().full_clean()
    settings.LOCAL_ENGINE = "vllm"
    demo.demo_engine_ensure().full_clean()


def test_the_supervisor_refuses_a_template_outside_the_folder_in_a_row_written_past_the_admin(
    settings,
):
    settings.ENGINE_FILES_DIR = FILES
    engine = make_engine(extra_args=["--chat-template", "/etc/passwd"])
    with pytest.raises(SupervisorError, match="--chat-template"):
        engine_command.command_line(engine)


@pytest.mark.parametrize(
    "name,value",
    [
        ("NCCL_NET_PLUGIN", "/tmp/libevil.so"),
        ("NCCL_TUNER_PLUGIN", "/tmp/libevil.so"),
        ("NCCL_PROFILER_PLUGIN", "evil"),
        ("NCCL_DEBUG_FILE", "/etc/cron.d/x"),
        ("TRITON_LIBCUDA_PATH", "/tmp/evil"),
        ("TRITON_PTXAS_PATH", "/tmp/evil"),
        ("TRITON_CACHE_DIR", "/tmp/kernels"),
        ("TORCHINDUCTOR_CACHE_DIR", "/tmp/kernels"),
        ("TORCH_EXTENSIONS_DIR", "/tmp/ext"),
        ("CUDA_HOME", "/tmp/cuda"),
        ("GGML_BACKEND_PATH", "/tmp/libevil.so"),
        ("LLAMA_ARG_PATH", "/"),
        ("LLAMA_ARG_SLOT_SAVE_PATH", "/etc"),
        ("VLLM_CACHE_ROOT", "/tmp/cache"),
    ],
)
def test_an_engine_environment_refuses_variables_that_load_code_or_name_host_paths(
    settings, name, value
):
    errors = field_errors(make_engine(environment={name: value}))
    assert name in errors["environment"][0]
    settings.ENGINE_ENV_ALLOWED = [name]  # not even the operator's list lets a row set them
    assert (
        name in field_errors(make_engine(name="again", environment={name: value}))["environment"][0]
    )


# These passed the engine environment's earlier patterns (CUDA_*, OMP_*, TRITON_*, VLLM_*) and load
# code or open what no engine of ours may serve.
CODE_LOADING = [
    ("CUDA_INJECTION64_PATH", "/tmp/libevil.so"),  # the CUDA runtime loads it into the engine
    ("CUDA_INJECTION32_PATH", "/tmp/libevil.so"),
    ("OMP_TOOL_LIBRARIES", "/tmp/libevil.so"),  # the OpenMP runtime loads it
    ("OMP_TOOL", "enabled"),
    ("TRITON_CACHE_MANAGER", "evil:Manager"),  # Triton imports the class it names
    ("TRITON_REMOTE_CACHE_BACKEND", "evil:Backend"),
    ("VLLM_SERVER_DEV_MODE", "1"),  # routes its key does not guard (/collective_rpc)
    ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"),  # the row's own field decides
    ("VLLM_PLUGINS", "evil"),
    ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"),  # unpickles what it is sent
    ("VLLM_API_KEY", "chosen"),  # the supervisor's
    ("LLAMA_API_KEY", "chosen"),
    ("HF_MODULES_CACHE", "/tmp/modules"),  # a folder on sys.path
]


@pytest.mark.parametrize(("name", "value"), CODE_LOADING)
def test_engine_variables_that_load_code_are_refused_by_name_with_a_clear_message(
    settings, name, value
):
    (message,) = field_errors(make_engine(environment={name: value}))["environment"]
    assert message.startswith(f"{name} is not allowed in an engine's environment: it loads code")
    settings.ENGINE_ENV_ALLOWED = [name]  # not even the operator's list lets a row set them
    again = field_errors(make_engine(name="again", environment={name: value}))["environment"]
    assert again == [message]


@pytest.mark.parametrize(("name", "value"), CODE_LOADING[:6])
def test_the_superuser_is_refused_each_code_loading_variable_in_the_admin(
    superuser_client, name, value
):
    engine = make_engine()
    response = _post_engine_form(
        superuser_client,
        engine,
        extra_args="[]",
        environment=json.dumps({name: value, "OMP_NUM_THREADS": "4"}),
    )
    assert response.status_code == 200
    assert f"{name} is not allowed in an engine&#x27;s environment" in response.content.decode()
    engine.refresh_from_db()
    assert engine.environment == {}


def test_a_variable_of_an_allowed_family_that_is_not_listed_is_refused_and_the_family_named():
    (message,) = field_errors(make_engine(environment={"CUDA_SOMETHING_NEW": "1"}))["environment"]
    assert message.startswith("CUDA_SOMETHING_NEW is not an engine variable a row may set")
    assert "CUDA_VISIBLE_DEVICES" in message and "by exact name" in message


def test_the_operators_list_adds_exact_names_not_patterns(settings):
    settings.ENGINE_ENV_ALLOWED = ["ACME_TUNING", "ACME_*"]
    make_engine(environment={"ACME_TUNING": "1"}).full_clean()
    other = make_engine(name="other", environment={"ACME_OTHER": "1"})
    assert field_errors(other)["environment"][0].startswith("ACME_OTHER is not an engine variable")


def test_no_engine_inherits_dev_mode_runtime_lora_or_a_key_from_the_workers_environment(
    monkeypatch,
):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    monkeypatch.setenv("VLLM_API_KEY", "the-workers")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # passed through, as before
    env = engine_command.environment(make_engine())
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert not {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY"} & set(
        env
    )
    lora = engine_command.environment(make_engine(name="lora", runtime_lora_updating=True))
    assert lora["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # the row's field, not the host's


def test_tuning_variables_stay_allowed():
    make_engine(
        environment={
            "NCCL_DEBUG": "INFO",
            "NCCL_P2P_DISABLE": "1",
            "TRITON_PRINT_AUTOTUNING": "1",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "LLAMA_LOG_VERBOSITY": "1",
            "HF_HOME": "/data/hf",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "OMP_NUM_THREADS": "8",
            "VLLM_CPU_OMP_THREADS_BIND": "0-7",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "NCCL_SOCKET_IFNAME": "eth0",
        }
    ).full_clean()


@pytest.mark.parametrize(
    "field", ["model", "served_model_name", "quantization", "dtype", "bind_host"]
)
def test_a_value_that_would_become_a_flag_is_refused(field):
    engine = make_engine(**{field: "--trust-remote-code"})
    assert "must not start with" in field_errors(engine)[field][0]


def test_an_adapter_path_that_would_become_a_flag_is_refused():
    engine = make_engine(enable_lora=True)
    adapter = LoraAdapter(engine=engine, name="x", path="--trust-remote-code")
    assert "path" in field_errors(adapter)


def test_the_supervisor_refuses_to_start_a_bad_row_and_says_why():
    engine = make_engine(
        environment={"LD_PRELOAD": "/tmp/evil.so"}, extra_args=["--trust-remote-code"]
    )
    with pytest.raises(EngineStartRefused, match="LD_PRELOAD"):
        supervisor.engine_start(engine_id=engine.pk)
    engine.refresh_from_db()
    assert engine.status == "stopped" and engine.desired_state == "stopped" and engine.pid is None
    assert "LD_PRELOAD" in engine.status_reason and "--trust-remote-code" in engine.status_reason
    assert EngineEvent.objects.filter(engine=engine, reason__contains="refused").exists()
    assert not processes_on(engine.port)
    with pytest.raises(SupervisorError, match="LD_PRELOAD"):
        engine_command.command_line(engine)


# --- who may edit ---------------------------------------------------------------------------------


@pytest.fixture
def superuser_client(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.fixture
def staff_client(client, django_user_model):
    """Staff with every permission of the app: they may look, not change."""
    staff = django_user_model.objects.create_user("operator", password="x", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="inference_ops"))
    client.force_login(staff)
    return client


def test_staff_can_view_engines_and_endpoints_but_not_change_them(staff_client):
    engine = make_engine()
    page = f"/admin/inference_ops/engineprocess/{engine.pk}/change/"
    assert staff_client.get(page).status_code == 200
    assert (
        staff_client.get(
            f"/admin/inference_ops/modelendpoint/{engine.endpoint.pk}/change/"
        ).status_code
        == 200
    )
    assert staff_client.get("/admin/inference_ops/engineprocess/add/").status_code == 403
    assert staff_client.get("/admin/inference_ops/modelendpoint/add/").status_code == 403
    response = staff_client.post(
        page,
        {
            "name": engine.name,
            "model": "evil",
            "kind": "simulator",
            "port": engine.port,
            "endpoint": engine.endpoint.pk,
        },
    )
    assert response.status_code == 403
    engine.refresh_from_db()
    assert engine.model == "acme/base"
    delete = f"/admin/inference_ops/modelendpoint/{engine.endpoint.pk}/delete/"
    assert staff_client.post(delete, {"post": "yes"}).status_code == 403


def test_the_superuser_sees_why_an_engine_row_is_refused(superuser_client):
    engine = make_engine()
    response = _post_engine_form(
        superuser_client,
        engine,
        extra_args='["--trust-remote-code"]',
        environment='{"LD_PRELOAD": "/tmp/evil.so"}',
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "LD_PRELOAD" in html and "--trust-remote-code" in html and "not allowed" in html
    engine.refresh_from_db()
    assert engine.environment == {}


def _post_engine_form(client, engine, *, extra_args: str, environment: str):
    """The engine row's admin form as a superuser would post it, with these two fields."""
    return client.post(
        f"/admin/inference_ops/engineprocess/{engine.pk}/change/",
        {
            "name": engine.name,
            "endpoint": engine.endpoint.pk,
            "kind": "simulator",
            "model": "acme/base",
            "bind_host": "127.0.0.1",
            "port": engine.port,
            "desired_state": "stopped",
            "extra_args": extra_args,
            "environment": environment,
            "startup_timeout": 30,
            "stop_timeout": 5,
            "adapters-TOTAL_FORMS": 0,
            "adapters-INITIAL_FORMS": 0,
            "events-TOTAL_FORMS": 0,
            "events-INITIAL_FORMS": 0,
        },
    )
