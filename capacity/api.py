"""GET /api/v1/capacity/events: what the capacity layer sent, how each try went, and what
each pool waits for (read-only; fleet:read, so a viewer may look)."""

from __future__ import annotations

import json

from django.utils import timezone
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import HasFleetScope
from capacity import selectors
from capacity.models import Attempt, ProvisionFailures, Spawn, Try


class TrySerializer(serializers.ModelSerializer):
    class Meta:
        model = Try
        fields = ["number", "started_at", "finished_at", "outcome", "status_code", "error"]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    """One attempt: its event (the body as stored: a claim code shows as its placeholder)."""

    tries = TrySerializer(source="try_rows", many=True, read_only=True)
    pool_name = serializers.SerializerMethodField()
    event = serializers.SerializerMethodField()

    class Meta:
        model = Attempt
        fields = [
            "event_id", "type", "pool", "pool_name", "subject", "destination_url", "state",
            "started_at", "next_try_at", "finished_at", "last_error", "reason", "event",
            "tries",
        ]  # fmt: skip
        read_only_fields = fields

    def get_pool_name(self, attempt: Attempt) -> str:
        return attempt.reading.get("pool_name", "")

    def get_event(self, attempt: Attempt) -> dict:
        return json.loads(attempt.body)


class SpawnSerializer(serializers.ModelSerializer):
    event_id = serializers.CharField(source="attempt.event_id", read_only=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True)
    teardown_event_id = serializers.SerializerMethodField()

    class Meta:
        model = Spawn
        fields = [
            "host_name", "state", "destination_url", "event_id", "pool", "created_at",
            "joined_at", "host", "unseen_since", "ended_at", "reason", "teardown_event_id",
        ]  # fmt: skip
        read_only_fields = fields

    def get_teardown_event_id(self, spawn: Spawn) -> str | None:
        return spawn.teardown.event_id if spawn.teardown_id else None


class ProvisionFailuresSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProvisionFailures
        fields = [
            "destination_url", "consecutive", "deferred_until", "last_failure_at", "last_cause",
        ]  # fmt: skip
        read_only_fields = fields


class CapacityEvents(APIView):
    permission_classes = [HasFleetScope]

    def get(self, request):
        publishing, pools = selectors.pool_waits(timezone.now())
        return Response(
            {
                "publishing": publishing,
                "pools": pools,
                "attempts": AttemptSerializer(selectors.recent_attempts(), many=True).data,
                "spawns": SpawnSerializer(
                    selectors.recent_spawns().select_related("teardown"), many=True
                ).data,
                "provision_failures": ProvisionFailuresSerializer(
                    selectors.provision_failures(), many=True
                ).data,
            }
        )
