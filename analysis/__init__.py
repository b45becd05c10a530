"""DuckDB SQL views over the trace store (issue 3)."""
