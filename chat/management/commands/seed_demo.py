from django.conf import settings
from django.core.management.base import BaseCommand

from chat.demo import demo_admin_ensure
from inference_ops import demo as engine_demo
from inference_ops.models import EngineProcess, ModelEndpoint
from knowledge.demo import demo_kb_load
from routing.demo import demo_rules_ensure, external_endpoint_ensure


class Command(BaseCommand):
    help = "Load the demo data of `make run` (idempotent) and print the admin login."

    def handle(self, *args, **options):
        username, password = demo_admin_ensure(password_file=settings.VAR_DIR / "admin-password")
        if password:
            self.stdout.write(f"admin login: {username} / {password}")
        else:
            self.stdout.write(f"admin login: {username} (password changed since it was generated)")
        report = demo_kb_load()
        if report is not None:
            self.stdout.write(f"demo knowledge base: {report.summary()}")
        engine = engine_demo.demo_engine_ensure()
        if engine is not None and engine_demo.missing(engine):
            # Not built yet: `make run` builds it in the background and starts it then.
            EngineProcess.objects.filter(pk=engine.pk).update(
                desired_state=EngineProcess.Desired.STOPPED
            )
        created = demo_rules_ensure(
            local=ModelEndpoint.objects.get(name="local"), external=external_endpoint_ensure()
        )
        if created:
            self.stdout.write(f"demo routing rules: {', '.join(created)}")
