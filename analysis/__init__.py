"""DuckDB SQL views over the trace store: breakdowns, summaries, collectives, stragglers."""

from .connect import connect, setup_sql

__all__ = ["connect", "setup_sql"]
