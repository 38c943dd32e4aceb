"""/api/v1/backups: list, take and verify backups, for administrators only (BAK-06).

Thin: parse, check access, call the service, render. A backup is taken by a worker (it may
take longer than a request should), so POST answers 202 and the list shows it when done.
The passphrase is the configured backup.passphrase: a secret never travels in a request
body or sits in the task queue. The dashboard's Settings page calls the same service.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.actors import actor_for
from accounts.permissions import RoleAccess
from accounts.roles import Level
from zoomies_site.backup import service
from zoomies_site.core.api_common import ListPages, page_of
from zoomies_site.core.api_parsers import RejectUnknownFields


class AdminOnly:
    permission_classes = [RoleAccess]
    read_level = Level.ADMIN
    write_level = Level.ADMIN


class BackupSerializer(serializers.Serializer):
    """One backup as service.list_backups finds it: its manifest, whether its file is there,
    and the error that keeps its manifest from being read (then little else is known)."""

    file = serializers.CharField()
    present = serializers.BooleanField()
    error = serializers.CharField(allow_null=True)
    created_at = serializers.CharField(required=False, help_text="UTC, ISO 8601")
    created_by = serializers.CharField(required=False, help_text="the actor who took it")
    host = serializers.CharField(required=False)
    zoomies_version = serializers.CharField(required=False)
    engine = serializers.CharField(required=False, help_text="sqlite or postgresql")
    engine_version = serializers.CharField(required=False)
    migrations = serializers.ListField(child=serializers.CharField(), required=False)
    size = serializers.IntegerField(required=False)
    sha256 = serializers.CharField(required=False)
    plain_size = serializers.IntegerField(required=False)
    plain_sha256 = serializers.CharField(required=False)
    encrypted = serializers.BooleanField(required=False)
    encryption = serializers.CharField(required=False, allow_null=True)
    format = serializers.IntegerField(required=False)


class NewBackupSerializer(RejectUnknownFields, serializers.Serializer):
    upload = serializers.BooleanField(
        default=False, help_text="also copy it to every remote in backup.remotes"
    )


class BackupQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    task = serializers.CharField(help_text="the django-q2 task that takes it")
    encrypted = serializers.BooleanField(help_text="whether backup.passphrase will encrypt it")


class BackupList(AdminOnly, APIView):
    """GET: the backups in backup.dir, newest first, paged. POST: take one (202, queued)."""

    pagination_class = ListPages

    @extend_schema(responses={200: BackupSerializer(many=True)})
    def get(self, request):
        return page_of(self, BackupSerializer(service.list_backups(), many=True).data)

    @extend_schema(request=NewBackupSerializer, responses={202: BackupQueuedSerializer})
    def post(self, request):
        body = NewBackupSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        upload = body.validated_data["upload"]
        try:
            queued = service.request_backup(actor=actor_for(request), upload=upload)
        except service.BackupError as exc:
            raise serializers.ValidationError({"upload": [str(exc)]}) from None
        return Response(queued, status=status.HTTP_202_ACCEPTED)


class BackupVerify(AdminOnly, APIView):
    """POST: verify one backup (checksum, decrypts with backup.passphrase, opens, integrity
    check, migrations against this code); 200 with each check, whether or not it passed."""

    def post(self, request, name: str):
        try:
            report = service.verify_named(name, actor=actor_for(request))
        except service.NoSuchBackup as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_404_NOT_FOUND)
        except service.BackupError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(report.as_dict())
