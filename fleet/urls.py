"""The agent protocol routes, under /api/v1/agent/ (docs/agent-protocol.md)."""

urlpatterns: list = []
