#!/bin/bash
# Checkpoints across launches, each phase a gtest of
# checkpoint_mpi_test run under mpirun by tools/mpi_test_runner.sh:
#   1. re-partitioning: saved by 4 ranks at stage 3, resumed by 2 at stage 2
#      and by 3 at stage 2 (shards that do not divide evenly); saved by
#      2 at stage 1, resumed by 4 at stage 3; saved by 4 at stage 3 under
#      bandwidth-centric partitioning, resumed by 3 under it and by 2 at
#      stage 2; the resumed losses and weights match a single-rank stage-0
#      run within 1e-5;
#   2. a rank killed (SIGKILL) after writing its shard of the step-4 save:
#      the job fails, the directory holds the shard but no marker, and the
#      next launch finds step 2 as the latest, refuses step 4 and saves it
#      again;
#   3. //zero:consolidate on the re-partitioned run: exit 0 and a file; exit
#      1 naming the shard when a shard is damaged; exit 2 on bad usage.
# Usage: checkpoint_phases_test.sh RUNNER BINARY CONSOLIDATE
set -uo pipefail
runner="$1" bin="$2" consolidate="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
phase() {  # N DIR STAGE TEST [PARTITIONING]
  echo "=== $4 on $1 ranks, stage $3 ${5:-CONTIGUOUS}, $2"
  MEMWALL_CKPT_DIR="$2" MEMWALL_CKPT_STAGE="$3" MEMWALL_CKPT_PARTITIONING="${5:-CONTIGUOUS}" \
    "$runner" "$1" "$bin" --gtest_filter="Phases.$4"
}

phase 4 "$tmp/r42" 3 SaveForRepartition || fail "save on 4 ranks"
phase 2 "$tmp/r42" 2 ResumeAfterRepartition || fail "resume 4 -> 2"
phase 3 "$tmp/r42" 2 ResumeAfterRepartition || fail "resume 4 -> 3"
phase 2 "$tmp/r24" 1 SaveForRepartition || fail "save on 2 ranks"
phase 4 "$tmp/r24" 3 ResumeAfterRepartition || fail "resume 2 -> 4"
phase 4 "$tmp/b43" 3 SaveForRepartition BANDWIDTH_CENTRIC || fail "bandwidth-centric save on 4 ranks"
phase 3 "$tmp/b43" 3 ResumeAfterRepartition BANDWIDTH_CENTRIC || fail "bandwidth-centric resume 4 -> 3"
phase 2 "$tmp/b43" 2 ResumeAfterRepartition || fail "bandwidth-centric 4 -> contiguous 2"

if MEMWALL_KILL_RANK=1 phase 2 "$tmp/kill" 2 KillDuringSave; then
  fail "the killed save's job succeeded"
fi
[[ -e "$tmp/kill/step_00000002/COMPLETE" ]] || fail "step 2 is not complete"
[[ -e "$tmp/kill/step_00000004/rank_00001.shard" ]] || fail "the victim's shard was not written before the kill"
[[ ! -e "$tmp/kill/step_00000004/COMPLETE" ]] || fail "the killed save has a marker"
phase 2 "$tmp/kill" 2 AfterKill || fail "after the kill"

out=$("$consolidate" "$tmp/r24" "$tmp/r24.safetensors") || fail "consolidate: exit $?"
echo "$out"
[[ "$out" == *"step_00000010"* && -s "$tmp/r24.safetensors" ]] || fail "consolidate wrote nothing: $out"
cp -r "$tmp/r24/step_00000010" "$tmp/bad"
printf '\xff' | dd of="$tmp/bad/rank_00000.shard" bs=1 seek=100 conv=notrunc status=none
err=$("$consolidate" "$tmp/bad" "$tmp/bad.safetensors" 2>&1); code=$?
[[ $code -eq 1 && "$err" == *"rank_00000.shard fails its checksum"* ]] || fail "damaged shard: exit $code: $err"
[[ ! -e "$tmp/bad.safetensors" ]] || fail "a damaged checkpoint left an output file"
out=$("$consolidate" "$tmp/b43" "$tmp/b43.safetensors") || fail "consolidate bandwidth-centric: exit $?"
[[ "$out" == *"step_00000010"* && -s "$tmp/b43.safetensors" ]] || fail "consolidate wrote nothing: $out"
err=$("$consolidate" "$tmp/r24" 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"usage"* ]] || fail "usage: exit $code: $err"
err=$("$consolidate" "$tmp/none" "$tmp/x.safetensors" 2>&1); code=$?
[[ $code -eq 1 && "$err" == *"$tmp/none"* ]] || fail "missing directory: exit $code: $err"
echo PASS
