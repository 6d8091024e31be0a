"""Cache invalidation only: any change to rules, targets, endpoints, group priority classes or the
privacy settings rebuilds every process's rule snapshot (after commit, so no process rebuilds from
uncommitted rows)."""

from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from inference_ops.models import EngineProcess, ModelEndpoint
from privacy.models import PrivacySettings
from routing.models import GroupPriority, RouteTarget, RoutingRule
from routing.rules import rules_changed


def _changed(sender, **kwargs):
    transaction.on_commit(rules_changed)


def _engine_changed(sender, created=False, update_fields=None, **kwargs):
    """An engine row's arguments say whether its endpoint runs priority scheduling; its state,
    written often by its supervisor with update_fields, does not matter here."""
    if created or update_fields is None or "extra_args" in update_fields:
        _changed(sender)


def connect():
    for model in (RoutingRule, RouteTarget, ModelEndpoint, GroupPriority, PrivacySettings):
        post_save.connect(_changed, sender=model, dispatch_uid=f"routing-{model.__name__}-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"routing-{model.__name__}-delete")
    post_save.connect(_engine_changed, sender=EngineProcess, dispatch_uid="routing-engine-save")
    m2m_changed.connect(
        _changed, sender=RoutingRule.groups.through, dispatch_uid="routing-rule-groups"
    )
