# The search matches a user's own messages only (chat.selectors), so nothing reads the GIN index
# over every user's words any more: dropped, and a message's save no longer indexes its text. The
# search functions of migration 0005 stay: the search calls them.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0006_apikey_client_name"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="message",
            name="message_search",
        ),
    ]
