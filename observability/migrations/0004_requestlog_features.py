from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("observability", "0003_requestlog_cost"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestlog",
            name="features",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
    ]
