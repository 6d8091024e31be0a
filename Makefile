# Two commands: `make run` (the product, in the foreground) and `make test` (the suite).
# Both create .venv and install requirements-dev.txt (the runtime set, requirements.txt, plus the
# tests' and tools') on first use; nothing else is needed but Python 3.11.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint lint-py lint-js lint-commits engines stop install check-deploy clean audit

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	@touch $(STAMP)

# exec: make's child is the runner itself, so SIGTERM to make reaches it (see devtools/devserver.py).
run: $(STAMP)
	exec $(PY) -m devtools.devserver

# The browser test drives Debian's Chromium, the Markdown renderer's tests run in Node; install
# them once if the machine lacks them.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser test (once)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@command -v node >/dev/null 2>&1 || { \
		echo "installing Debian's nodejs for the Markdown renderer's tests (once)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; }
	$(MAKE) --no-print-directory engines
	$(PY) -m pytest $(PYTEST_ARGS)

# The suite without its slow parts (a real browser, real processes started and stopped, real
# engines, PyTorch): what to run while working; `make test` runs everything.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not browser and not processes and not engines and not torch" $(PYTEST_ARGS)

# Lint, format and types (pyproject.toml), the JavaScript (eslint.config.js), then the subjects
# of the commits made since the rule came in (devtools/commit_subjects.py). CI runs it before the
# tests; .pre-commit-config.yaml runs the same on each commit.
lint: lint-py lint-js lint-commits

# mypy's Django plugin imports config.settings, which requires these: placeholders, as in the
# Dockerfile's build step (importing the settings reads them and connects to nothing).
MYPY_ENV := DEBUG=0 SECRET_KEY=mypy-placeholder DATABASE_URL=postgresql://mypy@127.0.0.1:1/mypy \
	REDIS_URL=redis://127.0.0.1:1/0

lint-py: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MYPY_ENV) $(PY) -m mypy

lint-js: node_modules/.installed
	node_modules/.bin/eslint .

lint-commits: $(STAMP)
	$(PY) -m devtools.commit_subjects

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The engines the suite runs for real, prepared once per machine into ~/.cache/answering-gateway:
# llama.cpp's llama-server (a compile, CPU-bound) and vLLM (a pip install into its own venv, then
# the model's conversion), side by side: the install mostly waits on the network and the disk.
engines: $(STAMP)
	@DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py cpu_engine_build & cpu=$$!; \
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py vllm_engine_build; vllm=$$?; \
	wait $$cpu && test $$vllm -eq 0

# Stop the embedded PostgreSQL and Redis (make run and make test stop them on exit).
stop: $(STAMP)
	$(PY) -c "from devtools import embedded; embedded.stop_all()"

clean: stop
	rm -rf var

# The production files alone (Dockerfile, docker-compose.yml, deploy/k8s), validated offline;
# `make test` runs the same checks with the rest.
check-deploy: $(STAMP)
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) -m pytest -q tests/deploy/test_deploy_files.py

# Known vulnerabilities in the pinned requirements (pip-audit, in its own venv so it pins nothing
# of ours). It asks PyPI's and OSV's vulnerability services, which these development machines
# cannot reach: run it in CI where they are; it is not part of `make test`.
AUDIT_VENV := var/audit-venv
audit:
	@test -x $(AUDIT_VENV)/bin/pip-audit || { $(PYTHON) -m venv $(AUDIT_VENV) && \
		$(AUDIT_VENV)/bin/pip install --disable-pip-version-check -q pip-audit==2.10.1; }
	$(AUDIT_VENV)/bin/pip-audit --requirement requirements.txt --no-deps --disable-pip --strict --progress-spinner off
