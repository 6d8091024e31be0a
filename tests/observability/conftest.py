import pytest


@pytest.fixture
def rows_by_hand(settings, db):
    """Each test starts from an empty log and writes its rows with request_flush; the writer
    thread must not take them first. The table is not Django's to flush between tests (it is
    unmanaged), so rows a server wrote for an earlier test may still be there."""
    from observability.models import RequestLog

    settings.REQUEST_LOG = True
    settings.REQUEST_LOG_FLUSH_SECONDS = 3600
    settings.REQUEST_LOG_FLUSH_ROWS = 10000
    settings.REQUEST_LOG_BUFFER_ROWS = 10000
    RequestLog.objects.all().delete()


@pytest.fixture
def operator(django_user_model):
    """Staff who may read the request log, and nothing else."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(
        "operator", password="pw-operator-123456", is_staff=True
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="observability", codename="view_requestlog"
        )
    )
    return user


@pytest.fixture
def operator_client(operator):
    from tests.support.personas import client_of

    return client_of(operator)
