"""/api/v1/provider-setups: Proxmox onboarding from the browser's side (MACH-20, MACH-22).
Admins only. A setup's GET shape is its name, endpoint and readiness: never the capability
(shown once, in the answer that made it) nor anything of the token. Discovery runs here, on
the server, with the staged token (fleet.provider_setups)."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import HasFleetScope
from accounts.roles import Level
from fleet import provider_setups
from fleet.models import ProviderSetup
from fleet.provider_setup_views import public_base
from zoomies_site.core.api_common import Conflict, DetailSerializer
from zoomies_site.core.api_parsers import RejectUnknownFields


class SetupStartSerializer(RejectUnknownFields, serializers.Serializer):
    name = serializers.CharField(help_text="the provider's name: a DNS label")


class SetupStartedSerializer(serializers.Serializer):
    """The one answer that carries the capability (inside `command`, and alone)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    capability = serializers.CharField()
    expires_at = serializers.DateTimeField()
    command = serializers.CharField(help_text="what root runs on the Proxmox host")


class SetupSerializer(serializers.ModelSerializer):
    """A setup's GET shape: what the browser may poll (MACH-22)."""

    ready = serializers.BooleanField(read_only=True, help_text="enrolled from the hypervisor")

    class Meta:
        model = ProviderSetup
        fields = ["id", "name", "endpoint", "ready", "expires_at"]
        read_only_fields = fields


class Row(serializers.DictField):
    child = serializers.JSONField()


class DiscoverySerializer(serializers.Serializer):
    nodes = serializers.ListField(child=Row())
    templates = serializers.ListField(child=Row())
    storages = serializers.ListField(child=Row())
    pools = serializers.ListField(child=Row())
    missing_privileges = serializers.ListField(child=serializers.CharField())


class DiscoveryFailedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    reason = serializers.ChoiceField(
        choices=["unreachable", "certificate", "token_refused", "no_answer", "refused"]
    )


class ProviderSetupList(APIView):
    """POST /api/v1/provider-setups {name}: a new setup, and the command that enrolls it."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN

    @extend_schema(request=SetupStartSerializer, responses={201: SetupStartedSerializer})
    def post(self, request):
        body = SetupStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            setup, capability = provider_setups.start_setup(
                name=body.validated_data["name"], actor=actor_for(request), now=timezone.now()
            )
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc
        answer = {
            "id": setup.pk, "name": setup.name, "capability": capability,
            "expires_at": setup.expires_at,
            "command": provider_setups.enroll_command(public_base(request), capability),
        }  # fmt: skip
        return Response(SetupStartedSerializer(answer).data, status=status.HTTP_201_CREATED)


class ProviderSetupDetail(APIView):
    """GET /api/v1/provider-setups/<id>: name, endpoint, readiness."""

    permission_classes = [HasFleetScope]
    read_level = Level.ADMIN

    @extend_schema(responses={200: SetupSerializer})
    def get(self, request, pk: int):
        setup = provider_setups.live_setups(timezone.now()).filter(pk=pk).first()
        if setup is None:
            raise NotFound(f"no setup {pk} (or it expired)")
        return Response(SetupSerializer(setup).data)


class ProviderSetupDiscover(APIView):
    """POST /api/v1/provider-setups/<id>/discover: the cluster as the staged token sees it.
    409 before enrollment; 502 with a `reason` when the cluster cannot be asked."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN

    @extend_schema(
        request=None,
        responses={200: DiscoverySerializer, 409: DetailSerializer, 502: DiscoveryFailedSerializer},
    )
    def post(self, request, pk: int):
        try:
            found = provider_setups.discover_setup(pk, actor=actor_for(request), now=timezone.now())
        except provider_setups.SetupGone as exc:
            raise NotFound(str(exc)) from exc
        except provider_setups.NotEnrolled as exc:
            raise Conflict(str(exc)) from exc
        except provider_setups.DiscoveryFailed as exc:
            failed = {"detail": exc.detail, "reason": exc.reason}
            return Response(failed, status=status.HTTP_502_BAD_GATEWAY)
        return Response(DiscoverySerializer(found.as_dict()).data)
