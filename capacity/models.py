"""Capacity-demand delivery state (built in its own issue)."""
