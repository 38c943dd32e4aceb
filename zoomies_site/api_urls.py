"""The REST API under /api/v1/ (the agent protocol has its own prefix)."""

from django.urls import path

from fleet.rest_api import HostList
from runners.api import JobList, PoolList, ProblemList, RunnerList

urlpatterns = [
    path("pools", PoolList.as_view(), name="api-pools"),
    path("runners", RunnerList.as_view(), name="api-runners"),
    path("jobs", JobList.as_view(), name="api-jobs"),
    path("hosts", HostList.as_view(), name="api-hosts"),
    path("problems", ProblemList.as_view(), name="api-problems"),
]
