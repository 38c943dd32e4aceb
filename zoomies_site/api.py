"""The REST API for settings and the Overview (issue 10 item 6; CONF-01, CONF-03, EVT-06)."""

from __future__ import annotations

from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import HasFleetScope
from accounts.roles import Level
from zoomies_site import actions, schema_fixes  # noqa: F401  (registers schema fixes)
from zoomies_site.core import registry
from zoomies_site.core.api_common import ListPages, page_of
from zoomies_site.overview import overview
from zoomies_site.problems import problems


class SettingSerializer(serializers.Serializer):
    """One registry entry as the Settings page shows it: help, value, where it came from."""

    key = serializers.CharField()
    value = serializers.JSONField(allow_null=True)
    default = serializers.JSONField(allow_null=True)
    # Named as the Settings page reads it; a DRF field has a `source` of its own.
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="default, file, database, environment or derived"
    )
    help = serializers.CharField()
    type = serializers.CharField()
    secret = serializers.BooleanField()
    env = serializers.CharField(allow_blank=True)
    range = serializers.CharField(allow_blank=True)
    choices = serializers.ListField(child=serializers.CharField())
    editable = serializers.BooleanField()


class SettingChange(serializers.Serializer):
    value = serializers.JSONField(help_text="as zoomies.yaml would hold it (durations as 20m)")


class FindingSerializer(serializers.Serializer):
    severity = serializers.CharField()
    key = serializers.CharField()
    title = serializers.CharField()
    why = serializers.CharField()
    fix = serializers.CharField()


class SettingRefused(serializers.Serializer):
    """The error shape, with the findings that refuse a value when there are any."""

    detail = serializers.CharField()
    findings = FindingSerializer(many=True, required=False)


def _row(key: str) -> dict:
    for row in registry.describe():
        if row["key"] == key:
            return row
    raise Http404(f"there is no setting called {key}")


class SettingList(APIView):
    """GET /api/v1/settings: every entry in the registry's order, secrets masked, paged."""

    permission_classes = [HasFleetScope]
    pagination_class = ListPages

    @extend_schema(responses={200: SettingSerializer(many=True)})
    def get(self, request):
        return page_of(self, registry.describe())


class SettingDetail(APIView):
    """GET /api/v1/settings/<key>; PUT sets its database layer (admins), validated with
    the findings that refuse it; DELETE goes back to the layers below."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN

    @extend_schema(responses={200: SettingSerializer})
    def get(self, request, key: str):
        return Response(_row(key))

    @extend_schema(request=SettingChange, responses={200: SettingSerializer, 400: SettingRefused})
    def put(self, request, key: str):
        body = SettingChange(data=request.data)
        body.is_valid(raise_exception=True)
        _row(key)
        try:
            actions.set_setting(key, body.validated_data["value"], actor=actor_for(request))
        except actions.InvalidSetting as exc:
            return Response(
                {"detail": str(exc), "findings": [f.as_dict() for f in exc.findings]}, status=400
            )
        registry.reload()
        return Response(_row(key))

    @extend_schema(responses={200: SettingSerializer, 400: SettingRefused})
    def delete(self, request, key: str):
        _row(key)
        try:
            actions.reset_setting(key, actor=actor_for(request))
        except actions.InvalidSetting as exc:
            return Response(
                {"detail": str(exc), "findings": [f.as_dict() for f in exc.findings]}, status=400
            )
        registry.reload()
        return Response(_row(key))


class Overview(APIView):
    """GET /api/v1/overview: queued jobs, runners by state, hosts by health, queue times."""

    permission_classes = [HasFleetScope]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response(overview(timezone.now()))


# -- problems -------------------------------------------------------------------------------


class ProblemSerializer(serializers.Serializer):
    key = serializers.CharField()
    severity = serializers.CharField()
    title = serializers.CharField()
    detail = serializers.CharField(required=False)


class ProblemList(APIView):
    """GET /api/v1/problems: the problems drawer's list, worked out afresh, paged.

    A plain APIView: it lists no model, and the browsable renderer asks a GenericAPIView
    for a queryset it does not have (a 500 before).
    """

    permission_classes = [HasFleetScope]
    pagination_class = ListPages

    @extend_schema(responses={200: ProblemSerializer(many=True)})
    def get(self, request):
        return page_of(self, problems(timezone.now()))
