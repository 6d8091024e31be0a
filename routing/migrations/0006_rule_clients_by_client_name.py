from django.db import migrations, models
import django.contrib.postgres.fields


class Migration(migrations.Migration):
    """The help text only: rules name API keys by the client name staff give them ("client:NAME"),
    no longer by the key's own name. The entries themselves are rewritten by
    chat.0006_apikey_client_name, which gives the keys their client names."""

    dependencies = [
        ('routing', '0005_rule_over_budget'),
    ]

    operations = [
        migrations.AlterField(
            model_name='routingrule',
            name='clients',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=100), blank=True, default=list, help_text='Only for these clients: "web" (the chat page), or "client:NAME" for the API keys staff gave that client name (API keys in the admin; never a key\'s own name, which its user chooses).', size=None),
        ),
    ]
