"""/api/v1/tokens, /api/v1/users and /api/v1/audit.
Thin: parse, check access, call one action, render."""

from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import actions, selectors
from accounts.actors import actor_for
from accounts.models import ApiToken, AuditLog, User
from accounts.permissions import RoleAccess
from accounts.roles import ALL_SCOPES, Level, role_level
from zoomies_site.core.api_parsers import RejectUnknownFields


class TokenSerializer(serializers.ModelSerializer):
    """A token's GET shape: never its secret or hash."""

    user = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id", "name", "user", "prefix", "scopes", "created_at", "expires_at",
            "last_used_at", "revoked_at", "revoked_by",
        ]  # fmt: skip
        read_only_fields = fields


class NewTokenSerializer(RejectUnknownFields, serializers.Serializer):
    """POST /api/v1/tokens: the token's name, scopes, lifetime and (for an admin) owner."""

    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ALL_SCOPES), allow_empty=False
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    user = serializers.CharField(required=False, help_text="another user's name (admins only)")


class TokenPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 100
    page_size_query_param = "limit"  # every list of the API takes ?limit=
    max_page_size = 1000


class TokenList(ListAPIView):
    """GET: your tokens (an admin sees all); POST: mint one, its secret in this answer only.

    A viewer may mint a read token in a signed-in session; with a token, only one carrying
    the admin scope manages tokens, so a leaked token cannot mint itself a successor.
    """

    permission_classes = [RoleAccess]
    write_level = Level.READ
    token_write_level = Level.ADMIN
    serializer_class = TokenSerializer
    pagination_class = TokenPagination

    def get_queryset(self):
        return selectors.tokens_for(self.request.user)

    def post(self, request):
        body = NewTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        owner = request.user
        wanted = body.validated_data.get("user")
        if wanted and wanted != owner.get_username():
            if role_level(owner.role) < Level.ADMIN:
                return Response(
                    {"detail": "only an admin mints tokens for another user"},
                    status=status.HTTP_403_FORBIDDEN,
                )
            owner = User.objects.filter(username=wanted).first()
            if owner is None:
                return Response({"user": [f"no user {wanted!r}"]}, status=400)
        try:
            token, secret = actions.create_api_token(
                user=owner,
                name=body.validated_data["name"],
                scopes=body.validated_data["scopes"],
                expires_at=body.validated_data.get("expires_at"),
                actor=actor_for(request),
            )
        except actions.AccountError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(
            {**TokenSerializer(token).data, "secret": secret}, status=status.HTTP_201_CREATED
        )


class TokenRevoke(APIView):
    """POST /api/v1/tokens/<id>/revoke: the token stops working; its row stays."""

    permission_classes = [RoleAccess]
    write_level = Level.READ
    token_write_level = Level.ADMIN

    def post(self, request, pk: int):
        token = selectors.access_token_for_user(request.user, pk)
        actions.revoke_api_token(token, actor=actor_for(request))
        return Response(TokenSerializer(token).data)


class AuditSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditLog
        fields = ["id", "at", "actor", "action", "target_type", "target_id", "detail"]
        read_only_fields = fields


class AuditPagination(CursorPagination):
    ordering = "-id"  # ids rise with time, and a cursor holds still while rows are added
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class AuditFilters(serializers.Serializer):
    actor = serializers.CharField(required=False, help_text="part of the actor's name")
    action = serializers.CharField(required=False, help_text="the action or its prefix")
    target_type = serializers.CharField(required=False)
    target_id = serializers.CharField(required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    who = serializers.ChoiceField(
        choices=list(selectors.WHO.items()),
        required=False,
        default="all",
        help_text="people, agents, controller or all (the default)",
    )


class AuditList(ListAPIView):
    """GET /api/v1/audit: who changed what, newest first; viewer and fleet:read."""

    permission_classes = [RoleAccess]
    serializer_class = AuditSerializer
    pagination_class = AuditPagination

    def get_queryset(self):
        filters = AuditFilters(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return selectors.audit_rows(**filters.validated_data)


class UserSerializer(serializers.ModelSerializer):
    """A user's GET shape: never a password hash."""

    # A plain string: a user may have no e-mail, and "" is not an address.
    email = serializers.CharField(read_only=True)
    oidc = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = ["id", "username", "email", "role", "is_active", "oidc", "date_joined",
                  "last_login"]  # fmt: skip
        read_only_fields = fields

    def get_oidc(self, user: User) -> bool:
        return bool(user.oidc_subject)


class NewUserSerializer(RejectUnknownFields, serializers.Serializer):
    """POST /api/v1/users: a local user; without a password it cannot sign in until one is set."""

    username = serializers.RegexField(r"^[\w.@+-]{1,150}$", max_length=150)
    role = serializers.ChoiceField(choices=User.Role.choices)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    password = serializers.CharField(
        required=False, allow_blank=False, write_only=True, max_length=4096
    )

    def validate_password(self, value: str) -> str:
        validate_password(value)  # the site's validators; their sentences become a 400
        return value


class UserChangeSerializer(RejectUnknownFields, serializers.Serializer):
    """PATCH /api/v1/users/<id>: change the role, the e-mail, or (re)activate."""

    role = serializers.ChoiceField(choices=User.Role.choices, required=False)
    email = serializers.EmailField(required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)


class UserPagination(CursorPagination):
    ordering = "username"
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class UserList(ListAPIView):
    """GET: every user; POST: create a local user with a role. Admins only (issue 10 item 2)."""

    permission_classes = [RoleAccess]
    read_level = Level.ADMIN
    write_level = Level.ADMIN
    serializer_class = UserSerializer
    pagination_class = UserPagination
    queryset = User.objects.all()

    @extend_schema(request=NewUserSerializer, responses={201: UserSerializer})
    def post(self, request):
        body = NewUserSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            user = actions.create_user(
                username=body.validated_data["username"],
                role=body.validated_data["role"],
                email=body.validated_data["email"],
                password=body.validated_data.get("password"),
                actor=actor_for(request),
            )
        except actions.AccountError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(UserSerializer(user).data, status=status.HTTP_201_CREATED)


class UserDetail(APIView):
    """GET one user; PATCH its role, e-mail or active state. The last active admin stays."""

    permission_classes = [RoleAccess]
    read_level = Level.ADMIN
    write_level = Level.ADMIN

    @extend_schema(responses={200: UserSerializer})
    def get(self, request, pk: int):
        return Response(UserSerializer(get_object_or_404(User, pk=pk)).data)

    @extend_schema(request=UserChangeSerializer, responses={200: UserSerializer})
    def patch(self, request, pk: int):
        user = get_object_or_404(User, pk=pk)
        body = UserChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            actions.update_user(
                user, actor=actor_for(request), keep_an_admin=True, **body.validated_data
            )
        except actions.AccountError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(UserSerializer(user).data)


class UserDeactivate(APIView):
    """POST /api/v1/users/<id>/deactivate: kept as a state, never a delete."""

    permission_classes = [RoleAccess]
    read_level = Level.ADMIN
    write_level = Level.ADMIN

    @extend_schema(request=None, responses={200: UserSerializer})
    def post(self, request, pk: int):
        user = get_object_or_404(User, pk=pk)
        try:
            actions.deactivate_user(user, actor=actor_for(request))
        except actions.AccountError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(UserSerializer(user).data)
