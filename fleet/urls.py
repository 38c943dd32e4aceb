"""The agent protocol routes, under /api/v1/agent/ (docs/agent-protocol.md)."""

from django.urls import path

from fleet import api

urlpatterns = [
    path("join", api.join, name="agent-join"),
    path("heartbeat", api.heartbeat, name="agent-heartbeat"),
    path("token/renew", api.renew_token, name="agent-token-renew"),
    path("tasks", api.tasks, name="agent-tasks"),
    path("tasks/<int:task_id>/result", api.task_result, name="agent-task-result"),
    path("tasks/results", api.results, name="agent-task-results"),
    path("reports", api.reports, name="agent-reports"),
    path("inventory", api.inventory, name="agent-inventory"),
    path("logs/<str:stream_id>", api.log_chunk, name="agent-log-chunk"),
]
