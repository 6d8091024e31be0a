from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0006_rule_clients_by_client_name"),
    ]

    operations = [
        migrations.AddField(
            model_name="routingrule",
            name="pin_named",
            field=models.BooleanField(
                default=False,
                help_text="Off: a request naming a model of this rule's chain gets it first, then "
                "the rest of the chain as fallbacks. On: only the model named, no fallback.",
                verbose_name="named requests use only the named model",
            ),
        ),
    ]
