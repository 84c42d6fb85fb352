#!/usr/bin/env bash
# Runs a gtest binary under `mpirun -np N --oversubscribe` on this host only.
# Usage: mpi_test_runner.sh N BINARY [gtest args...]
# Fails when any rank fails. Each rank's output is prefixed with its rank.
set -euo pipefail
n="$1"; shift
binary="$1"; shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks must not share Bazel's single XML output file.
unset XML_OUTPUT_FILE GTEST_OUTPUT
# Keep OpenMPI on this host: shared memory between ranks, loopback for
# its own out-of-band wire-up, and no probing of other interfaces.
exec mpirun -np "$n" --oversubscribe --bind-to none --tag-output \
  --mca btl self,vader --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
  --mca plm_rsh_agent false \
  "$binary" "$@"
