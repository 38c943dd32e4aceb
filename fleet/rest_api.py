"""The read API for hosts (the agent protocol lives in fleet/api.py)."""

from __future__ import annotations

from django.db.models import Count, Q
from rest_framework import generics, serializers

from accounts.permissions import HasFleetScope
from fleet.models import Host
from runners.states import LIVE_STATES


class HostSerializer(serializers.ModelSerializer):
    """A host's GET shape; `runners` is counted from rows, never stored (SCHED-09)."""

    runners = serializers.IntegerField(source="live_runners", read_only=True)

    class Meta:
        model = Host
        fields = [
            "id", "name", "health", "cordoned", "capacity", "runners", "backends",
            "platform", "labels", "cpus", "memory_mb", "disk_total_mb", "disk_free_mb",
            "version", "embedded", "joined_at", "last_heartbeat_at",
        ]  # fmt: skip
        read_only_fields = fields


class HostList(generics.ListAPIView):
    permission_classes = [HasFleetScope]
    serializer_class = HostSerializer
    # Counted in the list's one query, not one query per host.
    queryset = Host.objects.annotate(
        live_runners=Count("runners", filter=Q(runners__state__in=list(LIVE_STATES)))
    ).order_by("name")
    pagination_class = None
