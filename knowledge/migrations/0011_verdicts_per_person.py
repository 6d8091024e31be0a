"""Verdicts count once per person and question: a thumbs down queues for review only within its
user's daily allowance (`Feedback.queued`), and the answers of one question with one entry are
gathered by an index.

The thumbs down given before this migration stay in the review queue: they are marked queued."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("knowledge", "0010_hits_feedback"),
    ]

    operations = [
        migrations.AddField(
            model_name="feedback",
            name="queued",
            field=models.BooleanField(
                default=False,
                help_text="A thumbs down within its user's daily allowance: it puts a direct "
                "answer in the review queue.",
            ),
        ),
        migrations.RunSQL(
            "UPDATE knowledge_feedback SET queued = true WHERE verdict = 'down'",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="hit",
            name="review",
            field=models.CharField(
                blank=True,
                choices=[("right", "right"), ("wrong", "wrong")],
                help_text="A curator's verdict: it overrules the users' (Feedback) on every "
                "answer of the same question with the same entry.",
                max_length=8,
                verbose_name="curator's verdict",
            ),
        ),
        migrations.AddIndex(
            model_name="hit",
            index=models.Index(fields=["normalized", "entry"], name="hit_question_entry"),
        ),
        migrations.AddIndex(
            model_name="feedback",
            index=models.Index(
                condition=models.Q(queued=True),
                fields=["user", "updated_at"],
                name="feedback_queued_by_user",
            ),
        ),
    ]
