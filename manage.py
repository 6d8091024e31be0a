#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from config.bootstrap import process_setup

    try:
        # Development's servers and key with DEBUG on, then the settings read now, to report a bad
        # environment plainly.
        process_setup()
    except ImproperlyConfigured as exc:
        print(f"Configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
