"""Cache invalidation only: a change to the limits rebuilds every process's copy (after commit,
so no process rebuilds from uncommitted rows)."""

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from spend.models import Limit
from spend.policy import limits_changed


def _changed(sender, **kwargs):
    transaction.on_commit(limits_changed)


def connect():
    post_save.connect(_changed, sender=Limit, dispatch_uid="spend-limit-save")
    post_delete.connect(_changed, sender=Limit, dispatch_uid="spend-limit-delete")
