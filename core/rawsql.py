"""Model instances from hand-written SQL, for the few hot paths where the ORM's query building costs
more than the query itself (a one-row ORM `get` spends longer in Python than its round trip)."""

from typing import TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def columns(model: type[Model], alias: str) -> str:
    """The select list of every concrete column of `model`, qualified by `alias`, in field order."""
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def instance(model: type[M], row, start: int = 0) -> M:
    """The instance whose columns (as `columns` lists them) begin at `row[start]`, as the ORM builds
    it."""
    fields = model._meta.concrete_fields
    return model.from_db(
        connection.alias, [field.attname for field in fields], row[start : start + len(fields)]
    )


def width(model: type[Model]) -> int:
    return len(model._meta.concrete_fields)


def user_groups(user: str) -> str:
    """A subquery of the names of the groups of the user whose id is the SQL expression `user`."""
    from django.contrib.auth import get_user_model

    groups = get_user_model()._meta.get_field("groups")
    # auth's `groups` is a many-to-many field: it has a `through` model and a related model, and
    # the through model's `group` and `user` are foreign keys, each with a column.
    through = groups.remote_field.through._meta  # type: ignore[union-attr]
    group_id = through.get_field("group").column  # type: ignore[union-attr]
    user_id = through.get_field("user").column  # type: ignore[union-attr]
    return (
        f"SELECT g.name FROM {through.db_table} ug "  # noqa: S608 - _meta's names; values are parameters
        f"JOIN {groups.related_model._meta.db_table} g ON g.id = ug.{group_id} "
        f"WHERE ug.{user_id} = {user}"
    )
