"""The REST API for pools, runners, jobs and installations (issue 10 item 6).

Thin: parse, check access (accounts.permissions), call one action, render with the one GET
serializer per resource (the event frames reuse them, EVT-05). Lifecycle verbs are explicit
POST routes; nothing here writes a lifecycle field itself.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import HasFleetScope
from accounts.roles import Level
from fleet.models import Host
from runners import actions
from runners.actions import installations as installation_actions
from runners.actions import pools as pool_actions
from runners.host_facts import memory_blocked_now
from runners.models import Installation, Job, Pool, Runner
from runners.naming import runner_image
from runners.reconcile import runner_command
from runners.states import LIVE_STATES, TERMINAL_STATES, JobStatus, RunnerState
from zoomies_site.core.api_common import (
    Conflict,
    DetailSerializer,
    NamePages,
    Pages,
)
from zoomies_site.core.api_parsers import RejectUnknownFields


def _django_errors(exc: DjangoValidationError) -> serializers.ValidationError:
    if hasattr(exc, "error_dict"):
        return serializers.ValidationError(exc.message_dict)
    return serializers.ValidationError({"non_field_errors": exc.messages})


# -- pools ----------------------------------------------------------------------------------


class PoolSerializer(RejectUnknownFields, serializers.ModelSerializer):
    """A pool's GET shape (and the body POST and PATCH /api/v1/pools take)."""

    runs = serializers.SerializerMethodField(
        help_text="What each runner runs: the image, or a process pool's program on the host"
    )

    @extend_schema_field(str)
    def get_runs(self, pool: Pool) -> str:
        """Issue 21 item 10: a process pool with no image ran the host's default program
        unseen; the pool now says which, as the agent will run it."""
        try:
            image = runner_image(pool.image, pool.platform, pool.backend, dind=pool.dind)
            argv = runner_command(pool, image)
        except ValueError as exc:
            return f"nothing: {exc}"
        return image if argv is None else f"{' '.join(argv)} on the host ({image})"

    def validate_labels(self, labels):
        """Issue 21 item 10: a pool is chosen by its labels; with none of its own it would
        answer any `runs-on: self-hosted` job, which no operator asks for by leaving the
        list empty."""
        if isinstance(labels, list) and not labels:
            raise serializers.ValidationError("a pool needs at least one label of its own")
        return labels

    class Meta:
        model = Pool
        fields = [
            "id", "name", "installation", "repository", "labels", "backend", "platform",
            "host_selector", "image", "cpus", "memory_mb", "dind", "env", "ephemeral", "warm",
            "max_runners", "paused", "idle_timeout", "runner_group_id", "created_at", "runs",
            "auto_key", "size_class", "size_class_since", "auto_active",
        ]  # fmt: skip
        # Pausing is a lifecycle verb with its own route, not a field edit; an automatic
        # pool's key, class and activity are the controller's (SCHED-31).
        read_only_fields = [
            "id", "created_at", "paused", "runs", "auto_key", "size_class", "size_class_since",
            "auto_active",
        ]  # fmt: skip

    def validate(self, attrs):
        """The model's own validation (`Pool.clean`), as the admin runs it (issue 8 item 1)."""
        if self.instance is not None and self.instance.auto_key:
            owned = sorted(f for f in set(attrs) & set(pool_actions.AUTO_OWNED)
                           if attrs[f] != getattr(self.instance, f))  # fmt: skip
            if owned:
                raise serializers.ValidationError(
                    {
                        f: ["an automatic pool's shape is the controller's, from its hosts"]
                        for f in owned
                    }  # fmt: skip
                )
        values = (
            {f: getattr(self.instance, f) for f in Pool.VALIDATED_FIELDS} if self.instance else {}
        )
        values.update(attrs)
        try:
            Pool(**values).clean()
        except DjangoValidationError as exc:
            raise _django_errors(exc) from exc
        return attrs


class PoolList(generics.ListCreateAPIView):
    """GET /api/v1/pools, POST /api/v1/pools."""

    permission_classes = [HasFleetScope]
    serializer_class = PoolSerializer
    queryset = Pool.objects.all()
    pagination_class = NamePages

    def perform_create(self, serializer):
        try:
            serializer.instance = pool_actions.create_pool(
                dict(serializer.validated_data), actor=actor_for(self.request), now=timezone.now()
            )
        except DjangoValidationError as exc:
            raise _django_errors(exc) from exc


class PoolDetail(generics.RetrieveUpdateDestroyAPIView):
    """GET, PUT, PATCH, DELETE /api/v1/pools/<id>."""

    permission_classes = [HasFleetScope]
    serializer_class = PoolSerializer
    queryset = Pool.objects.all()

    def perform_update(self, serializer):
        changes = dict(serializer.validated_data)
        try:
            serializer.instance = pool_actions.update_pool(
                serializer.instance, changes, actor=actor_for(self.request), now=timezone.now()
            )
        except DjangoValidationError as exc:
            raise _django_errors(exc) from exc

    @extend_schema(responses={204: None, 409: DetailSerializer})
    def delete(self, request, *args, **kwargs):
        return super().delete(request, *args, **kwargs)

    def perform_destroy(self, instance):
        try:
            pool_actions.delete_pool(instance, actor=actor_for(self.request), now=timezone.now())
        except pool_actions.PoolInUse as exc:
            raise Conflict(str(exc)) from exc


class _PoolVerb(APIView):
    paused = True
    permission_classes = [HasFleetScope]

    @extend_schema(request=None, responses={200: PoolSerializer})
    def post(self, request, pk: int):
        pool = get_object_or_404(Pool, pk=pk)
        pool_actions.set_pool_paused(
            pool, paused=self.paused, actor=actor_for(request), now=timezone.now()
        )
        return Response(PoolSerializer(pool).data)


class PoolPause(_PoolVerb):
    """POST /api/v1/pools/<id>/pause: no new runners; the live ones finish their jobs."""

    paused = True


class PoolResume(_PoolVerb):
    """POST /api/v1/pools/<id>/resume."""

    paused = False


class PoolPrewarmAnswer(serializers.Serializer):
    image = serializers.CharField()
    hosts = serializers.ListField(child=serializers.CharField())


class PoolPrewarm(APIView):
    """POST /api/v1/pools/<id>/prewarm: every host that could run the pool prepares its
    image in the background, behind its runner starts (AGENT-14)."""

    permission_classes = [HasFleetScope]

    @extend_schema(request=None, responses={202: PoolPrewarmAnswer, 409: DetailSerializer})
    def post(self, request, pk: int):
        pool = get_object_or_404(Pool, pk=pk)
        try:
            image, hosts = pool_actions.prewarm_pool(
                pool, actor=actor_for(request), now=timezone.now()
            )
        except pool_actions.CannotPrewarm as exc:
            raise Conflict(str(exc)) from exc
        return Response(PoolPrewarmAnswer({"image": image, "hosts": hosts}).data, status=202)


# -- runners --------------------------------------------------------------------------------


def runner_queryset():
    """Runners as the list and the event frames show them: no output tails loaded."""
    return (
        Runner.objects.select_related("pool", "host")
        .annotate(has_tail=~Q(output_tail=""))
        .defer("output_tail")
    )


class RunnerSerializer(serializers.ModelSerializer):
    """A runner's GET shape in the list; `has_output_tail` says the detail route has more."""

    pool: serializers.SlugRelatedField[Pool] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    host: serializers.SlugRelatedField[Host] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    has_output_tail = serializers.SerializerMethodField()
    memory_blocked = serializers.SerializerMethodField()

    class Meta:
        model = Runner
        fields = [
            "id", "name", "pool", "host", "state", "phase", "message", "created_at",
            "state_changed_at", "finished_at", "image", "cpus", "memory_mb", "ephemeral",
            "exit_code", "github_runner_id", "has_output_tail", "online_at",
            "lent_memory_mb", "would_lend_memory_mb", "memory_blocked",
        ]  # fmt: skip
        # online_at: when GitHub first showed it online (issue 29 item 1); an idle runner
        # without it is still starting for the scheduler, and its provision timeout runs.
        # lent_memory_mb: what its host's memory valve lent it above memory_mb (HOST-29);
        # would_lend_memory_mb: what it would have been lent in observe mode (HOST-31);
        # memory_blocked: why a raise it needed was refused, for 15 min after (HOST-32).
        read_only_fields = fields

    def get_memory_blocked(self, runner: Runner) -> str:
        return memory_blocked_now(runner, timezone.now())

    def get_has_output_tail(self, runner: Runner) -> bool:
        # The list annotates it, so it never loads the tails themselves.
        has = getattr(runner, "has_tail", None)
        return bool(runner.output_tail) if has is None else bool(has)


class RunnerDetailSerializer(RunnerSerializer):
    """One runner, with the end of its output when it failed (issue 8 item 14)."""

    class Meta(RunnerSerializer.Meta):
        fields = [*RunnerSerializer.Meta.fields, "output_tail"]
        read_only_fields = fields


@extend_schema(
    parameters=[
        OpenApiParameter("state", str, enum=RunnerState.values, description="one state only"),
        OpenApiParameter("live", bool, description="true: live runners only; false: finished"),
        OpenApiParameter("pool", str, description="a pool's name"),
    ]
)
class RunnerList(generics.ListAPIView):
    """GET /api/v1/runners: live runners and the finished ones still kept (their retention)."""

    permission_classes = [HasFleetScope]
    serializer_class = RunnerSerializer
    pagination_class = Pages

    def get_queryset(self):
        qs = runner_queryset()
        params = self.request.query_params
        if params.get("state"):
            if params["state"] not in RunnerState.values:
                raise serializers.ValidationError({"state": ["not a runner state"]})
            qs = qs.filter(state=params["state"])
        live = params.get("live")
        if live in ("true", "1"):
            qs = qs.filter(state__in=list(LIVE_STATES))
        elif live in ("false", "0"):
            qs = qs.filter(state__in=list(TERMINAL_STATES))
        elif live is not None:
            raise serializers.ValidationError({"live": ["true or false"]})
        if params.get("pool"):
            qs = qs.filter(pool__name=params["pool"])
        return qs


class RunnerDetail(generics.RetrieveAPIView):
    """GET /api/v1/runners/<id>: one runner, and for a failed one the end of its output."""

    permission_classes = [HasFleetScope]
    serializer_class = RunnerDetailSerializer
    queryset = Runner.objects.select_related("pool", "host")


class RunnerDrain(APIView):
    """POST /api/v1/runners/<id>/drain: stop taking work and exit; a busy runner keeps
    `runners.drain_grace` to finish its job (RUN-11)."""

    permission_classes = [HasFleetScope]

    @extend_schema(
        request=None,
        parameters=[
            OpenApiParameter("confirm", bool, description="needed to drain a busy runner (RUN-12)")
        ],
        responses={200: RunnerDetailSerializer, 409: DetailSerializer},
    )
    def post(self, request, pk: int):
        runner = get_object_or_404(Runner, pk=pk)
        confirmed = request.query_params.get("confirm", "").lower() in ("true", "1", "yes")
        if runner.state == RunnerState.BUSY and not confirmed:
            # RUN-12: a busy runner's job is someone's build; draining it is asked twice.
            raise Conflict(
                f"runner {runner.name} is busy with a job: draining lets the job run for "
                "runners.drain_grace and then stops it; ask again with confirm=true"
            )
        result = actions.drain_runner(
            runner, now=timezone.now(), actor=actor_for(request), reason="drained through the API"
        )
        if not result.changed and result.current != RunnerState.DRAINING:
            raise Conflict(f"runner {runner.name} is {result.current}: it cannot be drained")
        runner = Runner.objects.select_related("pool", "host").get(pk=pk)
        return Response(RunnerDetailSerializer(runner).data)


# -- jobs -----------------------------------------------------------------------------------


class JobSerializer(serializers.ModelSerializer):
    """A job's GET shape: its labels, its queue time, its runner, and why it waits."""

    wait_reason = serializers.SerializerMethodField()
    wait_reason_at = serializers.SerializerMethodField()
    queue_seconds = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "github_id", "run_id", "repository", "name", "labels", "status",
            "conclusion", "runner", "runner_name", "fleet_failure", "created_at",
            "started_at", "completed_at", "source", "wait_reason", "wait_reason_at",
            "queue_seconds",
        ]  # fmt: skip
        read_only_fields = fields

    # Only a queued job is waiting: a started one's last reason is history, not news.
    def get_wait_reason(self, job: Job) -> str:
        return job.wait_reason if job.status == JobStatus.QUEUED else ""

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_wait_reason_at(self, job: Job):
        if job.status != JobStatus.QUEUED or job.wait_reason_at is None:
            return None
        return serializers.DateTimeField().to_representation(job.wait_reason_at)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_queue_seconds(self, job: Job):
        """From queued to started; null until it starts."""
        if job.started_at is None or job.created_at is None:
            return None
        return max((job.started_at - job.created_at).total_seconds(), 0.0)


@extend_schema(
    parameters=[OpenApiParameter("status", str, enum=JobStatus.values, description="one status")]
)
class JobList(generics.ListAPIView):
    """GET /api/v1/jobs."""

    permission_classes = [HasFleetScope]
    serializer_class = JobSerializer
    pagination_class = Pages

    def get_queryset(self):
        qs = Job.objects.all()
        status_ = self.request.query_params.get("status")
        if status_:
            if status_ not in JobStatus.values:
                raise serializers.ValidationError({"status": ["not a job status"]})
            qs = qs.filter(status=status_)
        return qs


class JobDetail(generics.RetrieveAPIView):
    """GET /api/v1/jobs/<id>."""

    permission_classes = [HasFleetScope]
    serializer_class = JobSerializer
    queryset = Job.objects.all()


# -- installations --------------------------------------------------------------------------


class InstallationSerializer(RejectUnknownFields, serializers.ModelSerializer):
    """An installation's GET shape, and what POST /api/v1/installations takes."""

    class Meta:
        model = Installation
        fields = [
            "id", "github_id", "account", "kind", "repositories", "active", "created_at",
            "last_webhook_at", "last_polled_at", "standdown_until", "standdown_reason",
        ]  # fmt: skip
        read_only_fields = [
            "id", "active", "created_at", "last_webhook_at", "last_polled_at",
            "standdown_until", "standdown_reason",
        ]  # fmt: skip
        # The repositories' check is the model's (validate_repository_names), as the command's.
        extra_kwargs = {"github_id": {"validators": [], "min_value": 1}}


class InstallationList(generics.ListCreateAPIView):
    """GET /api/v1/installations; POST adds one (or re-activates it), as
    `manage.py add_installation` does. Admins only change them."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN
    serializer_class = InstallationSerializer
    queryset = Installation.objects.all()
    pagination_class = Pages

    @extend_schema(responses={201: InstallationSerializer, 200: InstallationSerializer})
    def post(self, request, *args, **kwargs):
        return self.create(request, *args, **kwargs)

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        installation, created = installation_actions.add_installation(
            github_id=data["github_id"],
            account=data["account"],
            kind=data.get("kind", Installation.Kind.ORG),
            repositories=data.get("repositories", []),
            actor=actor_for(request),
            now=timezone.now(),
        )
        return Response(
            InstallationSerializer(installation).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class InstallationDetail(generics.RetrieveDestroyAPIView):
    """GET /api/v1/installations/<id>; DELETE stops serving it (kept, marked inactive)."""

    permission_classes = [HasFleetScope]
    write_level = Level.ADMIN
    serializer_class = InstallationSerializer
    queryset = Installation.objects.all()

    def perform_destroy(self, instance):
        installation_actions.remove_installation(
            instance, actor=actor_for(self.request), now=timezone.now()
        )
