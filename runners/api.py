"""The read API for pools, runners and jobs, plus pool creation. Thin: parse, check, act."""

from __future__ import annotations

from django.db import transaction
from rest_framework import generics, serializers

from accounts import audit
from accounts.permissions import HasFleetScope
from runners import naming
from runners.models import Job, Pool, Runner
from runners.reconcile import PROCESS_IMAGES


class PoolSerializer(serializers.ModelSerializer):
    """A pool's GET shape (and the body POST /api/v1/pools takes)."""

    class Meta:
        model = Pool
        fields = [
            "id", "name", "installation", "repository", "labels", "backend", "platform",
            "host_selector", "image", "cpus", "memory_mb", "dind", "ephemeral", "warm",
            "max_runners", "paused", "idle_timeout", "runner_group_id", "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]

    def validate_name(self, value: str) -> str:
        try:
            naming.validate_pool_name(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value

    def validate(self, attrs):
        backend = attrs.get("backend", getattr(self.instance, "backend", Pool.Backend.DOCKER))
        image = attrs.get("image", getattr(self.instance, "image", ""))
        if backend == Pool.Backend.PROCESS and image and image not in PROCESS_IMAGES:
            # A process runner runs on the host as the agent's user: never an arbitrary path.
            raise serializers.ValidationError(
                {"image": f"the process backend runs only {' or '.join(PROCESS_IMAGES)}"}
            )
        return attrs

    def validate_labels(self, value):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise serializers.ValidationError("labels must be a list of non-empty strings")
        return value


class RunnerSerializer(serializers.ModelSerializer):
    """A runner's GET shape."""

    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Runner
        fields = [
            "id", "name", "pool", "host", "state", "phase", "message", "created_at",
            "state_changed_at", "finished_at", "image", "cpus", "memory_mb", "ephemeral",
            "exit_code", "github_runner_id",
        ]  # fmt: skip
        read_only_fields = fields


class JobSerializer(serializers.ModelSerializer):
    """A job's GET shape."""

    class Meta:
        model = Job
        fields = [
            "id", "github_id", "run_id", "repository", "name", "labels", "status",
            "conclusion", "runner", "runner_name", "fleet_failure", "created_at",
            "started_at", "completed_at", "source",
        ]  # fmt: skip
        read_only_fields = fields


class PoolList(generics.ListCreateAPIView):
    permission_classes = [HasFleetScope]
    serializer_class = PoolSerializer
    queryset = Pool.objects.order_by("name")
    pagination_class = None

    def perform_create(self, serializer):
        with transaction.atomic():
            pool = serializer.save()
            actor = f"user:{self.request.user.get_username()}"
            audit.record(actor=actor, action="pool.create", target=pool)


class RunnerList(generics.ListAPIView):
    permission_classes = [HasFleetScope]
    serializer_class = RunnerSerializer
    queryset = Runner.objects.select_related("pool", "host").order_by("-created_at", "-pk")
    pagination_class = None


class JobList(generics.ListAPIView):
    permission_classes = [HasFleetScope]
    serializer_class = JobSerializer
    queryset = Job.objects.order_by("-created_at", "-pk")
    pagination_class = None

    def get_queryset(self):
        qs = super().get_queryset()
        status = self.request.query_params.get("status")
        return qs.filter(status=status) if status else qs[:500]


class ProblemList(generics.GenericAPIView):
    """GET /api/v1/problems: the problems drawer's list, worked out afresh."""

    permission_classes = [HasFleetScope]

    def get(self, request):
        from django.utils import timezone
        from rest_framework.response import Response

        from zoomies_site.problems import problems

        return Response(problems(timezone.now()))
