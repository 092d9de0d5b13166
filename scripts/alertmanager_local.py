"""A real Prometheus Alertmanager, built from its Go module with the local Go toolchain.

No release archive can be fetched here, so the binary is built from the module source
(``github.com/prometheus/alertmanager`` at :data:`VERSION`, through the Go module proxy
``go`` is configured with) and kept in a cache folder; later calls reuse it. The module
ships without its compiled web UI (``ui/app/dist`` is built with npm in its own release
process), and ``ui/web.go`` embeds that folder, so the build puts a one-page placeholder
there: the HTTP API (``/api/v2``), routing, grouping, inhibition and receivers are the
release's own code; only the browser UI is missing.

Usage::

    scripts/alertmanager-local path     # build if needed, print the binary's path
    scripts/alertmanager-local run -- --config.file=am.yml --web.listen-address=127.0.0.1:9093

Build time on a fresh machine: about 2 minutes on 2 cores (plus the module downloads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MODULE = "github.com/prometheus/alertmanager"
VERSION = "v0.35.0"
_PLACEHOLDER = "<!doctype html><title>Alertmanager</title><p>Built by ckptwatch without its web UI: use the API.</p>\n"


def cache_dir() -> Path:
    """``$CKPTWATCH_CACHE`` or ``~/.cache/ckptwatch``, then ``alertmanager-<version>``."""
    base = os.environ.get("CKPTWATCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ckptwatch")
    return Path(base) / f"alertmanager-{VERSION}"


def _go_env() -> dict[str, str]:
    # the machine's own Go: never let go.mod's go line fetch a toolchain
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}


def build(quiet: bool = False) -> Path:
    """The Alertmanager binary, built into :func:`cache_dir` when it is not there yet.

    Raises SystemExit with one line when ``go`` is missing or the download or build fails."""
    out = cache_dir() / "alertmanager"
    if out.is_file() and os.access(out, os.X_OK):
        return out
    go = shutil.which("go")
    if go is None:
        raise SystemExit("alertmanager-local: the Go toolchain (go) is needed to build Alertmanager")
    env = _go_env()
    got = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True,
                         env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        raise SystemExit(f"alertmanager-local: go mod download {MODULE}@{VERSION} failed: "
                         f"{(got.stderr or got.stdout).strip().splitlines()[-1:]}")
    source = Path(json.loads(got.stdout)["Dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="alertmanager-src-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(source, src)
        for root, dirs, files in os.walk(src):  # the module cache is read-only
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
        for ui in ("elm", "mantine"):
            (src / "ui" / "app" / "dist" / ui).mkdir(parents=True, exist_ok=True)
            (src / "ui" / "app" / "dist" / ui / "index.html").write_text(_PLACEHOLDER)
        if not quiet:
            print(f"alertmanager-local: building {MODULE}@{VERSION} (about 2 minutes)", file=sys.stderr)
        tmp_out = out.with_suffix(".part")
        made = subprocess.run([go, "build", "-trimpath", "-o", str(tmp_out), "./cmd/alertmanager"], cwd=src, env=env,
                              capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"alertmanager-local: go build failed: {made.stderr.strip()[-400:]}")
        os.replace(tmp_out, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("path", help="build if needed and print the binary's path")
    run = sub.add_parser("run", help="build if needed and run it with the arguments after --")
    run.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    binary = build()
    if a.cmd == "path":
        print(binary)
        return 0
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    os.execv(binary, [str(binary), *args])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
