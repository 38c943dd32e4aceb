#!/usr/bin/env python
"""Django's command-line utility for Zoomies."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415  # once DJANGO_SETTINGS_MODULE is set

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
