"""The request log's content type moves from the chat app's label to this one's, keeping its row
and so its permissions' rows: a group or user that could view the log under chat.view_requestlog
can as observability.view_requestlog, with nothing to grant again."""

from django.db import migrations


def _relabel(apps, schema_editor, *, source: str, dest: str) -> None:
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(
        schema_editor.connection.alias
    )
    old = content_types.filter(app_label=source, model="requestlog").first()
    if old is None:
        return  # a new database: post_migrate makes the row, under the model's label of the day
    # A row under the new label exists only when post_migrate ran between this app's two
    # migrations (a migrate stopped at 0001): its permissions are new, the old row's hold the
    # grants.
    content_types.filter(app_label=dest, model="requestlog").delete()
    old.app_label = dest
    old.save(update_fields=["app_label"])


def forwards(apps, schema_editor):
    _relabel(apps, schema_editor, source="chat", dest="observability")


def backwards(apps, schema_editor):
    _relabel(apps, schema_editor, source="observability", dest="chat")


class Migration(migrations.Migration):
    dependencies = [
        ("observability", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
