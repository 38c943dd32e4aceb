"""The REST API for hosts and join tokens (the agent protocol lives in fleet/api.py).

Thin: parse, check access, call one action in fleet/actions.py, render the GET shape.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import HasFleetScope
from fleet import actions
from fleet.host_checks import HostCheckRefused
from fleet.models import Host, JoinToken
from fleet.runner_side import runner_side
from fleet.throttling import capacity_of, hold_of
from zoomies_site.core.api_common import Conflict, DetailSerializer, NamePages, Pages


class HostSerializer(serializers.ModelSerializer):
    """A host's GET shape; `runners` is counted from rows, never stored (SCHED-09)."""

    runners = serializers.IntegerField(source="live_runners", read_only=True)
    lent_memory_mb = serializers.IntegerField(
        source="lent_memory", read_only=True,
        help_text="What its agent's memory valve has lent its live runners (HOST-29)",
    )  # fmt: skip
    effective_capacity = serializers.SerializerMethodField(
        help_text="The slots its throttle leaves (HOST-14)"
    )
    pressure_hold = serializers.SerializerMethodField(
        help_text="Why a fresh sample holds new starts here, or empty (HOST-13)"
    )

    class Meta:
        model = Host
        fields = [
            "id", "name", "health", "cordoned", "capacity", "runners", "backends",
            "platform", "labels", "cpus", "memory_mb", "disk_total_mb", "disk_free_mb",
            "version", "embedded", "joined_at", "last_heartbeat_at", "usage", "usage_at",
            "throttle_level", "throttle_reason", "effective_capacity", "pressure_hold",
            "last_check", "lent_memory_mb",
        ]  # fmt: skip
        read_only_fields = fields

    def get_effective_capacity(self, host: Host) -> int:
        return capacity_of(host)

    def get_pressure_hold(self, host: Host) -> str:
        return hold_of(host, timezone.now())


def host_queryset():
    """Hosts with their live runners counted, and their loans summed, in the same query,
    not one query per host."""
    live = Q(runners__state__in=list(runner_side().LIVE_STATES))
    return Host.objects.annotate(
        live_runners=Count("runners", filter=live),
        lent_memory=Coalesce(Sum("runners__lent_memory_mb", filter=live), 0),
    )


class HostList(generics.ListAPIView):
    """GET /api/v1/hosts."""

    permission_classes = [HasFleetScope]
    serializer_class = HostSerializer
    queryset = host_queryset()
    pagination_class = NamePages


class HostDetail(generics.RetrieveAPIView):
    """GET /api/v1/hosts/<id>."""

    permission_classes = [HasFleetScope]
    serializer_class = HostSerializer
    queryset = host_queryset()


class DrainAnswer(serializers.Serializer):
    host = HostSerializer()
    drained = serializers.ListField(child=serializers.CharField())


class _HostVerb(APIView):
    permission_classes = [HasFleetScope]

    def act(self, host: Host, request) -> dict:  # each verb's one action
        raise NotImplementedError

    def post(self, request, pk: int):
        host = get_object_or_404(Host, pk=pk)
        extra = self.act(host, request)
        return Response({"host": HostSerializer(host_queryset().get(pk=pk)).data, **extra})


class HostCordon(_HostVerb):
    """POST /api/v1/hosts/<id>/cordon: no new runners are placed on it."""

    @extend_schema(request=None, responses={200: DrainAnswer})
    def post(self, request, pk: int):
        return super().post(request, pk)

    def act(self, host, request):
        actions.set_host_cordon(
            host=host, cordoned=True, now=timezone.now(), actor=actor_for(request)
        )
        return {"drained": []}


class CheckAnswer(serializers.Serializer):
    host = HostSerializer()
    task = serializers.IntegerField(help_text="the check's task; its outcome is last_check")


class HostCheck(APIView):
    """POST /api/v1/hosts/<id>/check: ask the host's agent to look at itself (engines,
    disk, clock); 202, and the answer lands in the host's `last_check`. 409 while a check
    is under way or within 15 s of the last (TASK-11)."""

    permission_classes = [HasFleetScope]

    @extend_schema(request=None, responses={202: CheckAnswer, 409: DetailSerializer})
    def post(self, request, pk: int):
        host = get_object_or_404(Host, pk=pk)
        try:
            task = actions.request_host_check(host, now=timezone.now(), actor=actor_for(request))
        except HostCheckRefused as exc:
            raise Conflict(str(exc)) from None
        data = {"host": HostSerializer(host_queryset().get(pk=pk)).data, "task": task.pk}
        return Response(data, status=status.HTTP_202_ACCEPTED)


class HostUncordon(_HostVerb):
    """POST /api/v1/hosts/<id>/uncordon."""

    @extend_schema(request=None, responses={200: DrainAnswer})
    def post(self, request, pk: int):
        return super().post(request, pk)

    def act(self, host, request):
        actions.set_host_cordon(
            host=host, cordoned=False, now=timezone.now(), actor=actor_for(request)
        )
        return {"drained": []}


class HostDrain(_HostVerb):
    """POST /api/v1/hosts/<id>/drain: cordon it and drain every live runner on it."""

    @extend_schema(request=None, responses={200: DrainAnswer})
    def post(self, request, pk: int):
        return super().post(request, pk)

    def act(self, host, request):
        drained = actions.drain_host(host=host, now=timezone.now(), actor=actor_for(request))
        return {"drained": drained}


class JoinTokenSerializer(serializers.ModelSerializer):
    """A join token as listed: its prefix, never its secret."""

    host: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )

    class Meta:
        model = JoinToken
        fields = ["id", "prefix", "created_at", "expires_at", "used_at", "host", "created_by"]
        read_only_fields = fields


class NewJoinToken(serializers.Serializer):
    ttl_minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60, default=60)


class MintedJoinToken(JoinTokenSerializer):
    """The answer to a mint: the secret, shown this once."""

    secret = serializers.CharField(read_only=True)

    class Meta(JoinTokenSerializer.Meta):
        fields = [*JoinTokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class JoinTokenList(generics.ListCreateAPIView):
    """GET /api/v1/join-tokens; POST mints one for `manage.py agent --join` (AUTH-08)."""

    permission_classes = [HasFleetScope]
    serializer_class = JoinTokenSerializer
    queryset = JoinToken.objects.select_related("host")
    pagination_class = Pages

    @extend_schema(request=NewJoinToken, responses={201: MintedJoinToken})
    def post(self, request, *args, **kwargs):
        body = NewJoinToken(data=request.data)
        body.is_valid(raise_exception=True)
        token, secret = actions.create_join_token(
            now=timezone.now(),
            actor=actor_for(request),
            ttl=timedelta(minutes=body.validated_data["ttl_minutes"]),
        )
        data = {**JoinTokenSerializer(token).data, "secret": secret}
        return Response(data, status=status.HTTP_201_CREATED)
