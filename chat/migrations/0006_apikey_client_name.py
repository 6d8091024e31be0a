"""API keys get a client name that staff give them, and routing rules name keys by it.

Rules used to list a key as "key:NAME", NAME being the key's own name, which its user picks: any
user could create a key named like a partner's and take the partner's rule. Each such entry
becomes "client:NAME", and NAME becomes the client name of the live keys that matched it, when
those keys belong to one user: what that user's keys could do, they still can. When keys of
several users matched, none gets the name (one of them took another's rule, and a migration cannot
tell which): the rule then takes no key until staff give the name to the right one in the admin,
and the migration says so. Nothing matches after it that did not before.
"""

from django.db import migrations, models


def _rename_entries(rule, old: str, new: str) -> list[str]:
    return [new + entry[len(old) :] if entry.startswith(old) else entry for entry in rule.clients]


def forwards(apps, schema_editor):
    RoutingRule = apps.get_model("routing", "RoutingRule")
    ApiKey = apps.get_model("chat", "ApiKey")
    names: dict[str, list[str]] = {}  # a key name -> the rules that listed it
    for rule in RoutingRule.objects.exclude(clients=[]).order_by("pk"):
        for entry in rule.clients:
            if entry.startswith("key:"):
                names.setdefault(entry[len("key:") :], []).append(rule.name)
        rule.clients = _rename_entries(rule, "key:", "client:")
        rule.save(update_fields=["clients"])
    for name, rules in sorted(names.items()):
        live = ApiKey.objects.filter(name=name, revoked_at__isnull=True)
        owners = set(live.values_list("user_id", flat=True))
        if len(owners) == 1:
            live.update(client_name=name)
        elif owners:
            print(
                f"\n  API keys named {name!r} belong to {len(owners)} users; the client name "
                f"{name!r} went to none of them. Rule(s) {', '.join(rules)} now list "
                f"'client:{name}': give that client name to the right key in the admin."
            )


def backwards(apps, schema_editor):
    RoutingRule = apps.get_model("routing", "RoutingRule")
    for rule in RoutingRule.objects.exclude(clients=[]):
        rule.clients = _rename_entries(rule, "client:", "key:")
        rule.save(update_fields=["clients"])


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0005_versions_and_search"),
        ("routing", "0006_rule_clients_by_client_name"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="client_name",
            field=models.CharField(
                blank=True,
                help_text='Routing rules that list "client:NAME" take this key\'s traffic. Set by '
                "staff here only; the key's owner cannot set it. Empty: no rule that lists "
                "clients takes it.",
                max_length=100,
                verbose_name="client name",
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
