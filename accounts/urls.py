"""Sign-in routes outside the API: OIDC single sign-on (AUTH-02)."""

from django.urls import path

from accounts import oidc

urlpatterns = [
    path("oidc/authenticate/", oidc.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", oidc.CallbackView.as_view(), name="oidc_authentication_callback"),
]
