# Shared helpers for the torch_core real-run generators. Sourced by the s*.sh scenario scripts.
# Each scenario script sets SC (scenario folder name) and then calls the layout functions below.
#
# Layout of the scratch area (WORK=/work/realruns/work/job-<md5(SC)[:6]>, a neutral name):
#   $WORK/logs/<layout>/<attempt>/...   what a user has (copied to the fixture's logs/)
#   $WORK/prov/<layout>/<attempt>/...   exit codes, times, injector side-car logs, ckpt listings
#   $WORK/ckpt/<layout>/...             checkpoints (not committed)
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-/work/realruns/venv}"
PY="$VENV/bin/python"
TORCHRUN="$VENV/bin/torchrun"
TRAIN="$HERE/train_core.py"
INJ="$HERE/injector.py"
FIXROOT="${FIXROOT:-/work/main/tests/fixtures/realruns}"
export OMP_NUM_THREADS=1
PORT_BASE="${PORT_BASE:-29700}"

begin_scenario() {
  # neutral scratch name: the scenario name (sigkill, oom, enospc, ...) must not appear in logged paths
  WORKID="job-$(printf %s "$SC" | md5sum | cut -c1-6)"
  WORK="/work/realruns/work/$WORKID"
  rm -rf "$WORK"
  mkdir -p "$WORK/logs" "$WORK/prov" "$WORK/ckpt"
  PORT=$PORT_BASE
}

next_port() { PORT=$((PORT + 7)); }

# attempt_begin LAYOUT ATTEMPT : sets L (logs dir), P (provenance dir), C (ckpt dir), TAG
attempt_begin() {
  LAYOUT="$1"; ATT="$2"
  L="$WORK/logs/$LAYOUT/$ATT"; P="$WORK/prov/$LAYOUT/$ATT"; C="$WORK/ckpt/$LAYOUT"
  mkdir -p "$L" "$P" "$C"
  export CKPTW_TAG="$WORKID/$LAYOUT/$ATT"
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "$P/start_time_utc.txt"
  next_port
}

attempt_end() {  # attempt_end RC
  echo "$1" > "$P/exit_code.txt"
  date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "$P/end_time_utc.txt"
  (cd "$WORK/ckpt" && ls -laR --time-style=full-iso "$LAYOUT" > "$P/ckpt_listing_after.txt" 2>&1)
  echo "[$SC] $LAYOUT/$ATT exit=$1"
}

# injector in the background: inject_bg ARGS...   (writes to $P/injector.log, $P/injected_faults.jsonl)
inject_bg() {
  "$PY" "$INJ" --log "$P/injector.log" --fault-log "$P/injected_faults.jsonl" --ckpt-dir "$C" "$@" &
  INJ_PID=$!
}
inject_wait() { [ -n "${INJ_PID:-}" ] && { wait "$INJ_PID" 2>/dev/null; INJ_PID=; }; true; }

# ---------------------------------------------------------------- layouts
# a: torchrun --tee 3 --log-dir, console captured
run_a() {  # run_a NPROC train-args...
  local n="$1"; shift
  "$TORCHRUN" --nproc-per-node "$n" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" \
    --tee 3 --log-dir "$L/torchrun_logs" "$TRAIN" "$@" > "$L/console.log" 2>&1
}

# b1: --role trainer --local-ranks-filter 0,2 (console only)
run_b_role_filter() {
  local n="$1"; shift
  "$TORCHRUN" --nproc-per-node "$n" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" \
    --role trainer --tee 3 --local-ranks-filter 0,2 "$TRAIN" "$@" > "$L/console.log" 2>&1
}

# b2: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (console only)
run_b_prefix_template() {
  local n="$1"; shift
  TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${role_name}${local_rank}|${rank}]:' \
  "$TORCHRUN" --nproc-per-node "$n" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" \
    --role trainer --tee 3 "$TRAIN" "$@" > "$L/console.log" 2>&1
}

# c: two torchrun agents = 2 nodes x 2 procs, c10d rendezvous on 127.0.0.1
run_c_two_nodes() {
  mkdir -p "$L/node-a" "$L/node-b"
  local rid="${WORKID}-${ATT}"
  NODE_NAME=node-a "$TORCHRUN" --nnodes 2 --nproc-per-node 2 --node-rank 0 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id "$rid" --tee 3 --log-dir "$L/node-a/torchrun_logs" \
    "$TRAIN" "$@" > "$L/node-a/console.log" 2>&1 &
  local pa=$!
  sleep 0.5
  NODE_NAME=node-b "$TORCHRUN" --nnodes 2 --nproc-per-node 2 --node-rank 1 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id "$rid" --tee 3 --log-dir "$L/node-b/torchrun_logs" \
    "$TRAIN" "$@" > "$L/node-b/console.log" 2>&1 &
  local pb=$!
  wait $pa; local ra=$?
  wait $pb; local rb=$?
  echo "node-a=$ra node-b=$rb" > "$P/node_exit_codes.txt"
  [ $ra -eq 0 ] && [ $rb -eq 0 ]
}

# d: bare python (world size 1) inside a bash script whose own stderr is kept
run_d_bare() {
  local q=""
  for x in "$@"; do q="$q $(printf '%q' "$x")"; done
  cat > "$P/run.sh" <<EOF
#!/bin/bash
cd "$L"
echo "starting training at \$(date -u)"
$PY $TRAIN$q > train.log 2>&1
rc=\$?
echo "training exited with \$rc"
exit \$rc
EOF
  cp "$P/run.sh" "$L/run.sh"
  bash "$L/run.sh" > "$L/run.sh.stdout.log" 2> "$L/run.sh.stderr.log"
}

# e1: srun --label emulation (single "node", N tasks, env:// rendezvous)
run_e_srun() {
  local n="$1"; shift
  "$PY" "$HERE/srun_emu.py" --ntasks "$n" --label --port "$PORT" -- "$PY" "$TRAIN" "$@" > "$L/slurm-4242.out" 2>&1
}

# e2: pdsh emulation: pdsh -w node-a,node-b torchrun --nnodes 2 ... (one combined console)
run_e_pdsh() {
  local rid="${WORKID}-${ATT}"
  "$PY" "$HERE/pdsh_emu.py" -w node-a,node-b -- env NODE_NAME=%h "$TORCHRUN" --nnodes 2 --nproc-per-node 2 \
    --node-rank %n --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id "$rid" --tee 3 \
    "$TRAIN" "$@" > "$L/pdsh.log" 2>&1
}

# ---------------------------------------------------------------- collection
versions() {
  "$PY" - <<'EOF'
import sys, platform, torch
print(f"python {sys.version.split()[0]}")
print(f"torch {torch.__version__} (git {torch.version.git_version})")
print(f"platform {platform.platform()}")
EOF
  echo "nproc $(nproc)"
  echo "hostname $(hostname)"
}

collect() {  # copy logs + provenance into the fixture folder
  local F="$FIXROOT/$SC"
  rm -rf "$F/logs" "$F/provenance"
  mkdir -p "$F/logs" "$F/provenance/runs" "$F/provenance/scripts"
  cp -a "$WORK/logs/." "$F/logs/"
  cp -a "$WORK/prov/." "$F/provenance/runs/"
  cp "$HERE/common.sh" "$HERE/train_core.py" "$HERE/injector.py" "$HERE/srun_emu.py" "$HERE/pdsh_emu.py" \
     "$F/provenance/scripts/"
  cp "$0" "$F/provenance/run.sh"
  versions > "$F/provenance/versions.txt"
  [ -f "$HERE/expected/$SC.json" ] && cp "$HERE/expected/$SC.json" "$F/expected.json"
  [ -f "$HERE/readme/$SC.md" ] && cat "$HERE/readme/$SC.md" "$HERE/readme/_common.md" > "$F/provenance/README.md"
  du -sh "$F"
}

# ---------------------------------------------------------------- kernel OOM helpers (cgroup v1 memory controller here)
CGROOT="${CGROOT:-/sys/fs/cgroup/memory}"
oom_cgroup_create() {  # oom_cgroup_create NAME LIMIT -> sets CG
  CG="$CGROOT/$1"
  mkdir -p "$CG"
  echo "$2" > "$CG/memory.limit_in_bytes"
  { echo "cgroup $CG created at $(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)";
    echo "memory.limit_in_bytes=$(cat "$CG/memory.limit_in_bytes")"; } >> "$P/oom_cgroup.log"
  DMESG_BEFORE=$(dmesg | wc -l)
}
oom_cgroup_finish() {  # keep the new kernel lines as the user-visible kern.log (dmesg -T format)
  sleep 1
  dmesg -T | tail -n +$((DMESG_BEFORE + 1)) > "$L/kern.log"
  dmesg | tail -n +$((DMESG_BEFORE + 1)) > "$P/dmesg_raw.txt"
  { echo "memory.oom_control:"; cat "$CG/memory.oom_control";
    echo "memory.failcnt=$(cat "$CG/memory.failcnt")";
    echo "memory.max_usage_in_bytes=$(cat "$CG/memory.max_usage_in_bytes")"; } >> "$P/oom_cgroup.log"
  rmdir "$CG" && echo "cgroup $CG removed" >> "$P/oom_cgroup.log"
}
