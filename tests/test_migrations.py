import pytest
from django.core.management import call_command
from django.db import connection

pytestmark = pytest.mark.django_db


def test_migrations_are_up_to_date():
    # Exits with SystemExit(1) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_the_first_migration_installs_pgvector():
    with connection.cursor() as cursor:
        cursor.execute("SELECT '[1,2,3]'::vector <=> '[1,2,4]'::vector")
        distance = cursor.fetchone()[0]
    assert 0 < distance < 0.05
