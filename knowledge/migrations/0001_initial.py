from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    """The first migration of the project: every vector column depends on this extension."""

    initial = True
    dependencies = []
    operations = [VectorExtension()]
