#!/bin/bash
# Re-generate every framework fixture under tests/fixtures/realruns/ from real CPU runs.
# Not run by CI. Needs: root (tmpfs mounts for the ENOSPC scenarios), 2+ cores, a venv with
# torch, transformers, accelerate, lightning, deepspeed, safetensors (VENV, default /work/realruns/venv).
# Scratch: WORK (default /work/realruns/work2/runs). Output: FIX (default /work/main/tests/fixtures/realruns).
# Usage: make_all.sh [scenario ...]   (default: all scenarios/*.sh)
set -u
D=$(cd "$(dirname "$0")" && pwd)
if [ $# -gt 0 ]; then S=("$@"); else S=($(cd "$D/scenarios" && ls *.sh | sed 's/\.sh$//')); fi
for s in "${S[@]}"; do
  echo "=== $s $(date -u +%H:%M:%S)"
  bash "$D/scenarios/$s.sh" || echo "!!! $s failed"
done
