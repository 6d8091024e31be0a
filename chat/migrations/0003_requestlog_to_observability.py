"""The request log is the observability app's (its migration 0001 takes the model on). Only
Django's state changes here: the table stays where it is, under its name chat_requestlog."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("chat", "0002_requestlog")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[migrations.DeleteModel(name="RequestLog")],
        )
    ]
