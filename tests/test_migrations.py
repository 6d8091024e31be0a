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


@pytest.mark.django_db(transaction=True)
def test_the_request_log_moves_to_observability_with_its_rows_and_its_grants():
    """From the state before the move (the log chat's, a group granted chat.view_requestlog) to
    today's: the table keeps its rows, and the group's members may view the log as
    observability's, with nothing granted again."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission
    from django.db.migrations.executor import MigrationExecutor

    day = "chat_requestlog_p20000101"  # a day no other test writes to
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("observability", None), ("chat", "0002_requestlog")])
        operators = Group.objects.create(name="operators")
        operators.permissions.add(
            Permission.objects.get(content_type__app_label="chat", codename="view_requestlog")
        )
        get_user_model().objects.create_user("operator", is_staff=True).groups.add(operators)
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE {day} PARTITION OF chat_requestlog "
                "FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')"
            )
            cursor.execute(
                "INSERT INTO chat_requestlog (at, interface, status, latency_ms, request_key) "
                "VALUES ('2000-01-01T12:00:00Z', 'web', 'complete', 5, gen_random_uuid())"
            )
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

    from observability.models import RequestLog

    try:
        assert RequestLog.objects.filter(at__year=2000).count() == 1
        operator = get_user_model().objects.get(username="operator")
        assert operator.has_perm("observability.view_requestlog")
        assert not Permission.objects.filter(content_type__app_label="chat").filter(
            codename__endswith="_requestlog"
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {day}")
