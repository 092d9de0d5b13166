#!/bin/bash
# Regenerates every torch_core fixture under tests/fixtures/realruns/torch-*/ by really running PyTorch
# (CPU, gloo). Needs root (tmpfs mount, memory cgroup, dmesg), the venv at $VENV (default
# /work/realruns/venv) and about 20 minutes on 2 cores. Not run by CI.
set -u
cd "$(dirname "$0")"
for s in s1_torch_save_clean_resume.sh s2_dcp_clean_slow.sh s3_dcp_sigkill_mid_save.sh \
         s3b_bare_sigkill_mid_save.sh s4_dcp_oom_kill_mid_save.sh s4b_bare_oom_kill_mid_save.sh \
         s5_launcher_sigterm_mid_save.sh s6_enospc_during_save.sh s7a_rankfiles_world_size_4to2.sh \
         s7b_dcp_reshard_4to2.sh; do
  echo "=== $s $(date -u +%H:%M:%S)"
  bash "$s"
done
echo "=== done $(date -u +%H:%M:%S)"
