#!/usr/bin/env bash
# Starts N copies of a binary the way torchrun does, without torchrun: each
# with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
# MASTER_PORT, and no MPI variables. Fails when any rank fails; each rank's
# output is prefixed with its rank. "{rank}" in an argument becomes the
# rank (--gtest_output=xml:out_rank{rank}.xml). The GPU bundle carries it
# as launch.sh: how multi-rank jobs run on a machine without MPI.
# Usage: torchrun_test_runner.sh N BINARY [args...]
set -uo pipefail
n="$1"; shift
binary="$1"; shift
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
  SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_NTASKS_PER_NODE
# A port nothing listens on now (the kernel's pick for port 0).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
logs="$(mktemp -d "${TEST_TMPDIR:-/tmp}/torchrun.XXXXXX")"
pids=()
for ((r = 0; r < n; r++)); do
  args=()
  for a in "$@"; do args+=("${a//\{rank\}/$r}"); done
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$binary" "${args[@]}" > "$logs/rank_$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}" || { echo "rank $r failed (exit $?)"; status=1; }
done
for ((r = 0; r < n; r++)); do sed "s/^/[rank $r] /" "$logs/rank_$r.log"; done
exit $status
