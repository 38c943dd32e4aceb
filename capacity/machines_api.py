"""The REST API for rented machines and their providers (issue 23 item 7).

`/api/v1/machines` lists what the machine loop rents and why each machine is where it is;
its one verb is the release of a quarantined machine (an admin's: the loop could not prove
its resource ours, so a person decides). `/api/v1/providers` configures the providers the
loop may rent from: viewers read them, admins change them through fleet.provider_actions.

Here, above fleet, because the release is the machine loop's (capacity.machines).
"""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, mixins, serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import HasFleetScope
from accounts.roles import Level
from capacity import actions, machines
from fleet import provider_actions
from fleet.models import Machine, MachineProvider
from fleet.states import MachineState
from zoomies_site.core.api_common import Conflict, DetailSerializer, NamePages, Pages
from zoomies_site.core.api_parsers import RejectUnknownFields

# -- machines -------------------------------------------------------------------------------


class HostRef(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class MachineSerializer(serializers.ModelSerializer):
    """A machine's GET shape: where it is, since when, and why (`message`)."""

    host = serializers.SerializerMethodField()
    age_seconds = serializers.SerializerMethodField()

    class Meta:
        model = Machine
        fields = [
            "id", "name", "provider", "state", "pool_id", "host", "message", "created_at",
            "state_changed_at", "age_seconds",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(HostRef(allow_null=True))
    def get_host(self, machine: Machine):
        host = machine.host
        return None if host is None else {"id": host.pk, "name": host.name}

    def get_age_seconds(self, machine: Machine) -> float:
        """Since its row was made (planned), as of this answer."""
        now = self.context.get("now") or timezone.now()
        return max((now - machine.created_at).total_seconds(), 0.0)


def machine_queryset():
    return Machine.objects.select_related("host")


@extend_schema(
    parameters=[
        OpenApiParameter("state", str, enum=MachineState.values, description="one state only"),
        OpenApiParameter("provider", str, description="a provider's name"),
    ]
)
class MachineList(generics.ListAPIView):
    """GET /api/v1/machines: every machine row, the deleted ones included, newest first."""

    permission_classes = [HasFleetScope]
    serializer_class = MachineSerializer
    pagination_class = Pages

    def get_queryset(self):
        qs = machine_queryset()
        params = self.request.query_params
        if params.get("state"):
            if params["state"] not in MachineState.values:
                raise serializers.ValidationError({"state": ["not a machine state"]})
            qs = qs.filter(state=params["state"])
        if params.get("provider"):
            qs = qs.filter(provider=params["provider"])
        return qs


class MachineDetail(generics.RetrieveAPIView):
    """GET /api/v1/machines/<id>."""

    permission_classes = [HasFleetScope]
    serializer_class = MachineSerializer
    queryset = machine_queryset()


class MachineRelease(APIView):
    """POST /api/v1/machines/<id>/release: a quarantined machine's row is let go (deleted);
    its resource stays where it is, for a person to look at (MACH-08). Admins only."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN

    @extend_schema(request=None, responses={200: MachineSerializer, 409: DetailSerializer})
    def post(self, request, pk: int):
        try:
            actions.release_quarantined(pk, now=timezone.now(), actor=actor_for(request))
        except ObjectDoesNotExist:
            raise NotFound(f"no machine {pk}") from None
        except actions.NotQuarantined as exc:
            raise Conflict(str(exc)) from exc
        return Response(MachineSerializer(machine_queryset().get(pk=pk)).data)


# -- providers ------------------------------------------------------------------------------


class ProviderSerializer(RejectUnknownFields, serializers.ModelSerializer):
    """A provider's GET shape, and the body POST and PATCH /api/v1/providers take. What is
    wrong with a body is fleet.provider_actions' to say, for every surface alike. A proxmox
    provider is made from an enrolled setup (`setup`, MACH-23); its token is never shown."""

    setup = serializers.IntegerField(
        write_only=True, required=False,
        help_text="a proxmox provider: the enrolled setup whose connection it takes",
    )  # fmt: skip

    class Meta:
        model = MachineProvider
        fields = [
            "id", "name", "kind", "enabled", "pools", "max_machines", "max_per_pool",
            "slots_per_machine", "config", "created_at", "down_since", "last_error", "setup",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at", "down_since", "last_error"]
        # The action checks the name: a DNS label no other provider has.
        extra_kwargs = {"name": {"validators": []}}

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if instance.kind not in provider_actions.API_KINDS:
            data["config"] = None  # a kind this API does not know: nothing of its settings
        elif isinstance(data["config"], dict):
            secrets = provider_actions.SECRET_KEYS
            data["config"] = {k: v for k, v in data["config"].items() if k not in secrets}
        return data

    def validate(self, attrs):
        errors = provider_actions.provider_errors(attrs, instance=self.instance)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def _refused(exc: DjangoValidationError) -> serializers.ValidationError:
    return serializers.ValidationError(getattr(exc, "message_dict", {"detail": exc.messages}))


class ProviderList(generics.ListCreateAPIView):
    """GET /api/v1/providers; POST configures one (admins)."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN
    serializer_class = ProviderSerializer
    queryset = MachineProvider.objects.all()
    pagination_class = NamePages

    def perform_create(self, serializer):
        try:
            serializer.instance = provider_actions.create_provider(
                serializer.validated_data, actor=actor_for(self.request), now=timezone.now()
            )
        except DjangoValidationError as exc:
            raise _refused(exc) from exc


class ProviderDetail(
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    generics.GenericAPIView,
):
    """GET, PATCH, DELETE /api/v1/providers/<id> (changes: admins). No PUT: a provider is
    changed field by field, and its name and kind never."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN
    serializer_class = ProviderSerializer
    queryset = MachineProvider.objects.all()

    def get(self, request, *args, **kwargs):
        return self.retrieve(request, *args, **kwargs)

    def patch(self, request, *args, **kwargs):
        return self.partial_update(request, *args, **kwargs)

    def perform_update(self, serializer):
        try:
            serializer.instance = provider_actions.update_provider(
                serializer.instance,
                serializer.validated_data,
                actor=actor_for(self.request),
                now=timezone.now(),
            )
        except DjangoValidationError as exc:
            raise _refused(exc) from exc

    @extend_schema(responses={204: None, 409: DetailSerializer})
    def delete(self, request, *args, **kwargs):
        return self.destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        try:
            provider_actions.delete_provider(
                instance, actor=actor_for(self.request), now=timezone.now()
            )
        except provider_actions.ProviderInUse as exc:
            raise Conflict(str(exc)) from exc


class ProviderTestSerializer(serializers.Serializer):
    ok = serializers.BooleanField(help_text="the provider could rent a machine now")
    findings = serializers.ListField(
        child=serializers.CharField(), help_text="what would stop a create, one sentence each"
    )


class ProviderTestFailedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    reason = serializers.ChoiceField(
        choices=["unreachable", "certificate", "token_refused", "no_answer", "refused"]
    )


class ProviderTest(generics.GenericAPIView):
    """POST /api/v1/providers/<id>/test (admins): the provider asked, with its saved
    connection, whether it could rent a machine now: a missing privilege, a template gone,
    a pool or storage not found, a full cluster. 502 with a `reason` when it cannot be asked."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN
    queryset = MachineProvider.objects.all()

    @extend_schema(
        request=None,
        responses={200: ProviderTestSerializer, 502: ProviderTestFailedSerializer},
    )
    def post(self, request, *args, **kwargs):
        outcome = machines.test_provider(
            self.get_object(), actor=actor_for(request), now=timezone.now()
        )
        if outcome.reason:
            failed = {"detail": outcome.detail, "reason": outcome.reason}
            return Response(ProviderTestFailedSerializer(failed).data, status=502)
        answer = {"ok": not outcome.findings, "findings": outcome.findings}
        return Response(ProviderTestSerializer(answer).data)
