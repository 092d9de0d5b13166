"""notebooks/incident_history.ipynb runs top to bottom (nbclient, a real Jupyter kernel)
against a database built here from the corpus scenarios; a cell that errors fails the
build. Its pictures are there: one PNG per section."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from typer.testing import CliRunner

from ckptwatch import cli

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "incident_history.ipynb"
CORPUS = Path(__file__).resolve().parent.parent / "examples" / "corpus"


def test_the_incident_history_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    shutil.copytree(CORPUS, logs, ignore=shutil.ignore_patterns("*.json", "*.md"))
    db = tmp_path / "history.duckdb"
    res = CliRunner().invoke(cli.app, ["run", "--logs", str(logs), "--db", str(db), "--once"])
    assert res.exit_code == 0, res.output
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed without outputs
    monkeypatch.setenv("CKPTWATCH_DB", str(db))  # the kernel inherits it
    monkeypatch.chdir(tmp_path)
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()  # raises CellExecutionError on any error
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"].startswith(f"database {db} (at rest)\n[(17, 13)]")
    pictures = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pictures) == 5  # per day, jobs and hosts, latency, steps lost, the latest incident's timeline
    latest = code[-1].outputs[-1]["data"]["text/plain"]
    assert "root_cause" in latest or "collateral" in latest  # its evidence table
