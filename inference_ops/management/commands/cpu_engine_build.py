from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference_ops import cpu_engine
from inference_ops.exceptions import SupervisorError


class Command(BaseCommand):
    help = (
        "Build llama.cpp's llama-server for the CPU engine if it is missing (10 minutes or more on "
        "2 cores, once) and assemble the bundled model (or check CPU_ENGINE_MODEL)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--force", action="store_true", help="rebuild llama-server even if it exists"
        )

    def handle(self, *args, force, **options):
        def progress(line: str) -> None:
            self.stdout.write(f"cpu engine: {line}")
            self.stdout.flush()

        try:
            server = cpu_engine.ensure_llama_server(progress, force=force)
            model = cpu_engine.ensure_model(
                settings.CPU_ENGINE_MODEL or cpu_engine.BUNDLED_MODEL, progress
            )
        except SupervisorError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"llama-server: {server}\nmodel: {model}")
