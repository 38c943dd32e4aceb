"""The REST API under /api/v1/ (the agent protocol has its own prefix)."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from capacity import machines_api as machines
from fleet import provider_setup_api as setups
from fleet import rest_api as hosts
from runners import api as runners
from zoomies_site import api as site
from zoomies_site.backup.api import BackupList, BackupVerify
from zoomies_site.sse import EventStream

urlpatterns = [
    path("pools", runners.PoolList.as_view(), name="api-pools"),
    path("pools/<int:pk>", runners.PoolDetail.as_view(), name="api-pool"),
    path("pools/<int:pk>/pause", runners.PoolPause.as_view(), name="api-pool-pause"),
    path("pools/<int:pk>/resume", runners.PoolResume.as_view(), name="api-pool-resume"),
    path("pools/<int:pk>/prewarm", runners.PoolPrewarm.as_view(), name="api-pool-prewarm"),
    path("runners", runners.RunnerList.as_view(), name="api-runners"),
    path("runners/<int:pk>", runners.RunnerDetail.as_view(), name="api-runner"),
    path("runners/<int:pk>/drain", runners.RunnerDrain.as_view(), name="api-runner-drain"),
    path("jobs", runners.JobList.as_view(), name="api-jobs"),
    path("jobs/<int:pk>", runners.JobDetail.as_view(), name="api-job"),
    path("installations", runners.InstallationList.as_view(), name="api-installations"),
    path("installations/<int:pk>", runners.InstallationDetail.as_view(), name="api-installation"),
    path("hosts", hosts.HostList.as_view(), name="api-hosts"),
    path("hosts/<int:pk>", hosts.HostDetail.as_view(), name="api-host"),
    path("hosts/<int:pk>/cordon", hosts.HostCordon.as_view(), name="api-host-cordon"),
    path("hosts/<int:pk>/uncordon", hosts.HostUncordon.as_view(), name="api-host-uncordon"),
    path("hosts/<int:pk>/drain", hosts.HostDrain.as_view(), name="api-host-drain"),
    path("hosts/<int:pk>/check", hosts.HostCheck.as_view(), name="api-host-check"),
    path("join-tokens", hosts.JoinTokenList.as_view(), name="api-join-tokens"),
    path("machines", machines.MachineList.as_view(), name="api-machines"),
    path("machines/<int:pk>", machines.MachineDetail.as_view(), name="api-machine"),
    path(
        "machines/<int:pk>/release", machines.MachineRelease.as_view(), name="api-machine-release"
    ),
    path("providers", machines.ProviderList.as_view(), name="api-providers"),
    path("providers/<int:pk>", machines.ProviderDetail.as_view(), name="api-provider"),
    path("providers/<int:pk>/test", machines.ProviderTest.as_view(), name="api-provider-test"),
    path("provider-setups", setups.ProviderSetupList.as_view(), name="api-provider-setups"),
    path(
        "provider-setups/<int:pk>", setups.ProviderSetupDetail.as_view(), name="api-provider-setup"
    ),
    path(
        "provider-setups/<int:pk>/discover",
        setups.ProviderSetupDiscover.as_view(),
        name="api-provider-setup-discover",
    ),
    path("settings", site.SettingList.as_view(), name="api-settings"),
    path("settings/<str:key>", site.SettingDetail.as_view(), name="api-setting"),
    path("problems", site.ProblemList.as_view(), name="api-problems"),
    path("overview", site.Overview.as_view(), name="api-overview"),
    path("events", EventStream.as_view(), name="api-events"),
    path("schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("capacity/", include("capacity.urls")),
    path("backups", BackupList.as_view(), name="api-backups"),
    path("backups/<str:name>/verify", BackupVerify.as_view(), name="api-backup-verify"),
    path("", include("accounts.api_urls")),
]
