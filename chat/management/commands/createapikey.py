from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.apikeys import apikey_create
from chat.exceptions import ApiKeyInvalid


class Command(BaseCommand):
    help = "Create an API key for a user. The key is printed once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True)
        parser.add_argument(
            "--name", default="cli", help="a name to recognise the key by (default: cli)"
        )
        parser.add_argument(
            "--scope",
            action="append",
            choices=["chat", "kb"],
            dest="scopes",
            help="repeatable; default: chat",
        )

    def handle(self, *args, user, name, scopes, **options):
        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"no user named {user!r}")
        try:
            key, raw = apikey_create(user=account, name=name, scopes=scopes or ["chat"])
        except ApiKeyInvalid as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"created key {key.name!r} ({', '.join(key.scopes)}) for {account.username}"
        )
        self.stdout.write(raw)
