"""The django-q2 cluster as a child program of `manage.py workers`:
`python -m zoomies_site.cluster_child PARENT_PID`.

It is tied to its parent as the controller's forked children are (zoomies_site/core/
forked.py): it dies with `manage.py workers` however that dies, and so does every process
it forks (django-q2's sentinel, workers, monitor and pusher).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    # First thing: the tie to the parent, before Django or anything else is imported.
    from zoomies_site.core.forked import die_with_parent, tie_forks_to_parent  # noqa: PLC0415

    die_with_parent(int(argv[0]))  # also armed before the exec; this checks the race
    tie_forks_to_parent()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
    import django  # noqa: PLC0415  # after the tie: nothing runs untied
    from django.core.management import call_command  # noqa: PLC0415

    django.setup()
    from django.conf import settings  # noqa: PLC0415

    if settings.TASK_CLUSTER == "threads":
        from zoomies_site.thread_cluster import ThreadCluster  # noqa: PLC0415  # after setup: it imports django-q2

        ThreadCluster().run()
    else:
        call_command("qcluster")


if __name__ == "__main__":
    main(sys.argv[1:])
