"""Cache invalidation only: any change to rules, targets or endpoints rebuilds every
process's rule snapshot (after commit, so no process rebuilds from uncommitted rows)."""

from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from inference_ops.models import ModelEndpoint
from routing.models import RouteTarget, RoutingRule
from routing.rules import rules_changed


def _changed(sender, **kwargs):
    transaction.on_commit(rules_changed)


def connect():
    for model in (RoutingRule, RouteTarget, ModelEndpoint):
        post_save.connect(_changed, sender=model, dispatch_uid=f"routing-{model.__name__}-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"routing-{model.__name__}-delete")
    m2m_changed.connect(
        _changed, sender=RoutingRule.groups.through, dispatch_uid="routing-rule-groups"
    )
