"""The request log, taken on from the chat app (its migration 0003 lets the model go). Only Django's
state changes: the table chat's migration 0002 made stays, with its name, partitions and rows."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("chat", "0003_requestlog_to_observability"),
        ("knowledge", "0006_calibration"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="RequestLog",
                    fields=[
                        ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                        ("at", models.DateTimeField(verbose_name="time")),
                        (
                            "interface",
                            models.CharField(
                                choices=[("web", "browser"), ("api", "chat API"), ("v1", "/v1 API")],
                                max_length=8,
                            ),
                        ),
                        ("session_id", models.BigIntegerField(null=True)),
                        ("road", models.CharField(blank=True, max_length=16)),
                        ("rule", models.CharField(blank=True, max_length=100)),
                        ("target", models.CharField(blank=True, max_length=100)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("complete", "complete"),
                                    ("partial", "partial"),
                                    ("failed", "failed"),
                                    ("cancelled", "cancelled"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("error_code", models.CharField(blank=True, max_length=40)),
                        ("ttft_ms", models.FloatField(null=True, verbose_name="TTFT ms")),
                        ("latency_ms", models.FloatField(verbose_name="latency ms")),
                        ("overhead_ms", models.FloatField(null=True, verbose_name="gateway ms")),
                        ("prompt_tokens", models.IntegerField(null=True, verbose_name="tokens in")),
                        (
                            "completion_tokens",
                            models.IntegerField(null=True, verbose_name="tokens out"),
                        ),
                        (
                            "kb_method",
                            models.CharField(blank=True, max_length=16, verbose_name="KB match"),
                        ),
                        ("kb_hit", models.BooleanField(default=False, verbose_name="KB answered")),
                        ("kb_score", models.FloatField(null=True, verbose_name="KB score")),
                        ("fallbacks", models.SmallIntegerField(default=0)),
                        ("request_key", models.UUIDField()),
                        (
                            "api_key",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="+",
                                to="chat.apikey",
                            ),
                        ),
                        (
                            "kb_entry",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="+",
                                to="knowledge.entry",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                db_constraint=False,
                                null=True,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "request log row",
                        "db_table": "chat_requestlog",
                        "ordering": ["-at"],
                    },
                )
            ],
        )
    ]
