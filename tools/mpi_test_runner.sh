#!/usr/bin/env bash
# Runs a gtest binary under `mpirun -np N --oversubscribe` on this host only.
# Usage: mpi_test_runner.sh N BINARY [gtest args...]
# Fails when any rank fails. Each rank's output is prefixed with its rank.
set -euo pipefail
n="$1"; shift
binary="$1"; shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks must not share Bazel's single XML output file or premature-exit file.
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
# Bazel runs tests in PID namespaces, so concurrent mpiruns get the same PID
# and hence the same OpenMPI job id, and would share (and delete) each other's
# session files and shared-memory segments in /tmp and /dev/shm. A private
# directory for both keeps them apart.
session_dir="$(mktemp -d "${TEST_TMPDIR:-/tmp}/ompi.XXXXXX")"
# mpirun hands its ranks only the variables named with -x (the sanitizers'
# OpenMPI suppressions are built in: tools/mpi_sanitizers.cc).
forward=()
for var in LSAN_OPTIONS ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS MEMWALL_COLLECTIVE_TIMEOUT_S; do
  if [[ -n "${!var:-}" ]]; then forward+=(-x "$var"); fi
done
export TMPDIR="$session_dir"
# Keep OpenMPI on this host: shared memory between ranks, loopback for
# its own out-of-band wire-up, and no probing of other interfaces.
exec mpirun -np "$n" --oversubscribe --bind-to none --tag-output \
  --mca btl self,vader --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
  --mca plm_rsh_agent false --mca orte_tmpdir_base "$session_dir" \
  --mca btl_vader_backing_directory "$session_dir" \
  --mca shmem_mmap_backing_file_base_dir "$session_dir" \
  "${forward[@]}" "$binary" "$@"
