from django.core.management.base import BaseCommand, CommandError

from inference_ops import supervisor
from inference_ops.exceptions import SupervisorError
from inference_ops.models import EngineProcess


class Command(BaseCommand):
    help = (
        "Operate an engine on this host: start, stop, restart (waiting for the result) or status."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "restart", "status"])
        parser.add_argument(
            "name", nargs="?", help="engine name; status without a name lists them all"
        )

    def handle(self, *args, action, name, **options):
        if action == "status" and not name:
            for engine in EngineProcess.objects.order_by("name"):
                self._status(engine)
            return
        if not name:
            raise CommandError(f"engine {action} needs an engine name")
        engine = EngineProcess.objects.filter(name=name).first()  # type: ignore[assignment]  # the loop's name, reused
        if engine is None:
            known = ", ".join(EngineProcess.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no engine named {name!r} (known: {known})")
        try:
            if action == "start":
                engine = supervisor.engine_start(engine_id=engine.pk)
            elif action == "stop":
                engine = supervisor.engine_stop(engine_id=engine.pk)
            elif action == "restart":
                engine = supervisor.engine_restart(engine_id=engine.pk)
        except SupervisorError as exc:
            raise CommandError(str(exc)) from None
        self._status(engine)

    def _status(self, engine):
        metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(engine.metrics.items())) or "no metrics"
        self.stdout.write(
            f"{engine.name}: {engine.status} ({engine.status_reason or '-'}); "
            f"desired {engine.desired_state}; pid {engine.pid or '-'}; {engine.base_url}; {metrics}"
        )
