"""The agent protocol routes, under /api/v1/agent/ (docs/agent-protocol.md)."""

from django.urls import path

from fleet import api

urlpatterns = [
    path("join", api.join, name="agent-join"),
    path("heartbeat", api.heartbeat, name="agent-heartbeat"),
    path("tasks", api.tasks, name="agent-tasks"),
    path("tasks/<int:task_id>/result", api.task_result, name="agent-task-result"),
    path("reports", api.reports, name="agent-reports"),
]
