#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 - load settings now, to report a bad environment plainly
    except ImproperlyConfigured as exc:
        print(f"Configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
