"""The migration that moves routing rules from a key's own name ("key:NAME", which any user could
copy) to the client name staff give keys ("client:NAME"): what one user's keys could reach they
still reach, and a name several users' keys shared goes to none of them."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("chat", "0005_versions_and_search"), ("routing", "0005_rule_over_budget")]


@pytest.mark.django_db(transaction=True)
def test_rules_move_to_client_names_given_only_where_one_user_held_the_name(capsys):
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        user, api_key, rule = (
            old.get_model("auth", "User"),
            old.get_model("chat", "ApiKey"),
            old.get_model("routing", "RoutingRule"),
        )
        partner, intruder, mobile = (
            user.objects.create(username=name) for name in ("acme-bot", "mallory", "mo")
        )
        for owner, name, prefix, revoked_at in [
            (partner, "acme", "p1", None),
            (intruder, "acme", "p2", None),  # a copy of the partner's name
            (mobile, "mobile-app", "p3", None),
            (intruder, "mobile-app", "p4", timezone.now()),  # revoked: matched nothing
            (mobile, "laptop", "p5", None),  # no rule names it
        ]:
            api_key.objects.create(
                user=owner,
                name=name,
                prefix=prefix,
                key_hash="0" * 64,
                scopes=["chat"],
                revoked_at=revoked_at,
            )
        rule.objects.create(name="partner", clients=["web", "key:acme"])
        rule.objects.create(name="mobile", clients=["key:mobile-app"])
        rule.objects.create(name="browser", clients=["web"])
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

    from chat.models import ApiKey
    from routing.models import RoutingRule

    assert dict(RoutingRule.objects.values_list("name", "clients")) == {
        "partner": ["web", "client:acme"],
        "mobile": ["client:mobile-app"],
        "browser": ["web"],
    }
    assert dict(ApiKey.objects.values_list("prefix", "client_name")) == {
        "p1": "",
        "p2": "",
        "p3": "mobile-app",
        "p4": "",
        "p5": "",
    }
    said = capsys.readouterr().out
    assert "API keys named 'acme' belong to 2 users" in said and "partner" in said
