"""Demo data for `make run`: loaded on every start, idempotent.

Later layers add their own rows here (KB entries, routing rules, a local engine).
"""

import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction


def demo_admin_ensure(*, password_file: Path) -> tuple[str, str | None]:
    """Make sure a superuser `admin` exists. Returns (username, password or None).

    The generated password is kept in `password_file` (git-ignored, mode 600) so
    every start can print it; None when someone has since changed it.
    """
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.select_for_update().filter(username="admin").first()
        if user is None:
            password = secrets.token_urlsafe(12)
            user_model.objects.create_superuser(
                username="admin", email="admin@example.com", password=password
            )
            password_file.write_text(password)
            password_file.chmod(0o600)
            return "admin", password
    try:
        password = password_file.read_text().strip()
    except OSError:
        return "admin", None
    return "admin", password if user.check_password(password) else None
