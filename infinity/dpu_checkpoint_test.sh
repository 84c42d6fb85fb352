#!/bin/bash
# The delayed parameter update and checkpoints (dpu_checkpoint_mpi_test.cc),
# each phase its own mpirun launch, so every resume runs in a new process:
# for the optimizer on the host and on NVMe, at 1 and 2 ranks, the run that
# saves every step, the run that never saves, and the runs resumed from each
# of its checkpoints end with the same weights bit for bit.
# Usage: dpu_checkpoint_test.sh RUNNER BINARY
set -uo pipefail
runner="$1" bin="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
for offload in cpu nvme; do
  for ranks in 1 2; do
    dir="$tmp/$offload-$ranks"
    mkdir -p "$dir"
    for phase in SavingEveryStepMatchesNeverSaving ResumedRunsMatchNeverSaving; do
      echo "=== $phase: offload $offload, $ranks rank(s)"
      MEMWALL_DPU_DIR="$dir" MEMWALL_DPU_OFFLOAD="$offload" \
        "$runner" "$ranks" "$bin" --gtest_filter="DpuCheckpoints.$phase" || fail "$phase ($offload, $ranks ranks)"
    done
  done
done
echo PASS
