"""The errors the agent protocol answers with; `status` is the HTTP status of the answer.

Their own module so that both fleet actions and the runner actions the agent API calls
(`runners.actions.reports`) can raise them without importing each other.
"""

from __future__ import annotations


class FleetError(Exception):
    """A request the fleet refuses."""

    status = 400


class InvalidRequest(FleetError):
    status = 400


class InvalidJoinToken(FleetError):
    status = 401


class TaskNotFound(FleetError):
    status = 404


class TaskNotInFlight(FleetError):
    status = 409


class InvalidAgentToken(FleetError):
    """The agent token is unknown, replaced or expired (ESC-06)."""

    status = 401


class TokenNotRenewable(FleetError):
    """The host's agent token does not expire, so there is nothing to renew."""

    status = 409
