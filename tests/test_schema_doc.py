"""docs/schema.md lists every table and column of the database the code makes, with its
type: read the page and compare it with DuckDB's catalog."""

from __future__ import annotations

import re
from pathlib import Path


from ckptwatch.sinks import migrations
from ckptwatch.sinks.alerts.notification_log import NotificationLog
from ckptwatch.sinks.duckdb_store import Store

DOC = Path(__file__).resolve().parent.parent / "docs" / "schema.md"
_TYPES = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE"}


def documented() -> dict[str, dict[str, str]]:
    """table -> column -> type, as docs/schema.md gives them."""
    out: dict[str, dict[str, str]] = {}
    table = None
    for line in DOC.read_text().splitlines():
        head = re.match(r"^## `(\w+)`", line) or re.match(r"^View \*\*`(\w+)`\*\*", line)
        if head:
            table = head.group(1)
            if table == "evidence":  # the view: incident_evidence's columns plus its own
                out[table] = dict(out["incident_evidence"])
            continue
        if line.startswith("## "):
            table = "schema_version" if line == "## Versions" else None
            continue
        row = re.match(r"^\| `(\w+)` \| ([A-Z\[\]]+) \|", line)
        if table and row:
            out.setdefault(table, {})[row.group(1)] = _TYPES.get(row.group(2), row.group(2))
        state = re.match(r"^\| `(\w+)` \| (.+?) \| [^|]+\|$", line)
        if table is None and state and "VARCHAR" in state.group(2):  # "Pipeline state tables"
            out[state.group(1)] = {c: _TYPES.get(t, t) for c, t in re.findall(r"`(\w+)` ([A-Z]+)", state.group(2))}
    return out


def actual(tmp_path: Path) -> dict[str, dict[str, str]]:
    store = Store(str(tmp_path / "doc.duckdb"))
    NotificationLog(store.con)  # the alerts table (made by run and sink's alerter)
    rows = store.con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                             "WHERE database_name = current_database() AND schema_name = 'main'").fetchall()
    store.close()
    out: dict[str, dict[str, str]] = {}
    for table, column, typ in rows:
        out.setdefault(table, {})[column] = typ
    return out


def test_every_table_and_column_is_documented_with_its_type(tmp_path):
    doc, real = documented(), actual(tmp_path)
    assert sorted(doc) == sorted(real)
    for table in real:
        assert doc[table] == real[table], table
    assert f"# The DuckDB schema (version {migrations.SCHEMA_VERSION})" in DOC.read_text()

