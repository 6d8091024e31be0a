# A question's KB passages as the engine got them, for replaying the conversation byte for byte
# (chat.models.Message.context). A database default: the turn's start writes its rows in one raw
# statement, and old rows read as "no passages", replayed as they were before.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0007_search_without_the_gin_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="context",
            field=models.TextField(blank=True, db_default=""),
        ),
    ]
