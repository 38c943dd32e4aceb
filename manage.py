#!/usr/bin/env python
"""Django's command-line utility for Zoomies in a checkout: the `zoomies` command
(zoomies_site/cli.py), which a wheel installs as a console script."""

from zoomies_site.cli import main

if __name__ == "__main__":
    main()
