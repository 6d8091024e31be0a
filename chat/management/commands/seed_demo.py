from django.conf import settings
from django.core.management.base import BaseCommand

from chat.demo import demo_admin_ensure
from knowledge.demo import demo_kb_load


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
