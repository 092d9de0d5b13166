"""Sinks: where incidents and their evidence go (DuckDB, the console report)."""
