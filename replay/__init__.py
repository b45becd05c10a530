"""Dependency-graph replay and what-if projection (issue 4)."""
