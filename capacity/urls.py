"""The capacity API under /api/v1/capacity/."""

from django.urls import path

from capacity.api import CapacityEvents

urlpatterns = [path("events", CapacityEvents.as_view(), name="api-capacity-events")]
