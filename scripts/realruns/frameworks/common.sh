# Shared helpers for the framework scenario scripts (sourced, not run).
# Each scenario runs in $WORK/<scenario>/ (cwd), so paths in the logs are relative (out/checkpoint-20).
# Its user-visible logs go to logs/, everything else to provenance/; then the folder is copied
# to $FIX/<scenario>/ (checkpoint files are not copied).
set -u
FW=/work/main/scripts/realruns/frameworks
VENV=${VENV:-/work/realruns/venv}
WORK=${WORK:-/work/realruns/work2/runs}
FIX=${FIX:-/work/main/tests/fixtures/realruns}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TZ=Etc/UTC
export PATH=$VENV/bin:$PATH

begin_scenario() {  # begin_scenario NAME SCRIPT_PATH
  S=$1; R=$WORK/$S
  rm -rf "$R"; mkdir -p "$R/logs" "$R/provenance"; cd "$R"
  cp "$2" provenance/run.sh
  cp "$FW/common.sh" provenance/common.sh
  mkdir -p provenance/scripts; cp "$FW"/*.py provenance/scripts/   # the exact trainer/injector code that ran
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > provenance/scenario_start_utc.txt
  : > provenance/injected_faults.jsonl
  python - 2>/dev/null >/dev/null <<'PY'
import json, platform, importlib
v = {"python": platform.python_version(), "platform": platform.platform()}
for m in ["torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "safetensors", "numpy"]:
    try:
        v[m] = importlib.import_module(m).__version__
    except Exception as e:  # noqa
        v[m] = f"not importable: {type(e).__name__}"
open("provenance/versions.json", "w").write(json.dumps(v, indent=1) + "\n")
PY
}

attempt() {  # attempt NAME cmd... : runs cmd with stdout+stderr -> logs/NAME/console.log
  local n=$1; shift
  mkdir -p "logs/$n" "provenance/$n"
  printf '%q ' "$@" > "provenance/$n/command.txt"; echo >> "provenance/$n/command.txt"
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "provenance/$n/start_time_utc.txt"
  "$@" > "logs/$n/console.log" 2>&1
  local rc=$?
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "provenance/$n/end_time_utc.txt"
  echo $rc > "provenance/$n/exit_code.txt"
  echo "[$S] $n exit=$rc" >&2
  return 0
}

watch_and_signal() {  # background fault watcher; args passed to fault_watcher.py
  python "$FW/fault_watcher.py" --log provenance/fault_watcher.log --fault-log provenance/injected_faults.jsonl "$@" &
  WATCHER_PID=$!
  sleep 0.2
}

ckpt_listing() {  # ckpt_listing LABEL DIR
  ls -laR --time-style=full-iso "$2" > "provenance/ckpt_listing_$1.txt" 2>&1 || true
}

note_injection() {  # note_injection JSON  (a fault injected by the script itself, e.g. tmpfs size)
  echo "$1" >> provenance/injected_faults.jsonl
}

finish_scenario() {  # copies logs/, provenance/, expected.json, mtimes.json to $FIX/$S
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > provenance/scenario_end_utc.txt
  rm -rf "${FIX:?}/$S"; mkdir -p "$FIX/$S"
  # the logs' own mtimes date their undated lines: record them here, not the copy's
  python -c "from pathlib import Path; from ckptwatch.groundtruth import record_mtimes; record_mtimes(Path('.'))"
  cp -rp logs provenance expected.json mtimes.json "$FIX/$S/"
  [ -f README.provenance.md ] && cp README.provenance.md "$FIX/$S/provenance/README.md"
  du -sh "$FIX/$S" >&2
}

ALL_KINDS='"interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save", "corrupt_checkpoint", "load_failure", "poisoned_resume", "world_size_mismatch", "post_resume_regression"'
