#!/bin/bash
# A rank that vanishes mid-step: killed (SIGKILL) or stopped for
# good (SIGSTOP), on 2 and on 4 ranks. Every other rank must end within
# BOUND seconds and the job must fail, saying which rank died (mpirun's
# "process rank R ... exited on signal 9") or that a collective waited past
# MEMWALL_COLLECTIVE_TIMEOUT_S (runtime/collective_watchdog.h), instead of
# hanging in the step's collectives.
# Usage: dead_rank_test.sh RUNNER BINARY
set -uo pipefail
runner="$1" bin="$2"
bound=60
export MEMWALL_COLLECTIVE_TIMEOUT_S=15
fail() { echo "FAIL: $*"; exit 1; }

for n in 2 4; do
  for how in kill stop; do
    victim=$((n - 1))
    echo "=== $n ranks, rank $victim: $how"
    start=$(date +%s)
    # `timeout` only reports a hang: it ends the job at twice the bound.
    out=$(MEMWALL_DEAD_RANK=$victim MEMWALL_DEAD_HOW=$how timeout -k 10 $((2 * bound)) \
          "$runner" "$n" "$bin" 2>&1)
    code=$?
    seconds=$(( $(date +%s) - start ))
    echo "$out" | grep -E "memwall: rank|noticed that process rank|exited on signal|non-zero status" | head -5
    echo "exit $code after $seconds s"
    [[ $code -ne 0 ]] || fail "$n ranks, $how: the job succeeded"
    [[ $code -ne 124 ]] || fail "$n ranks, $how: still running after $((2 * bound)) s (a hang)"
    (( seconds <= bound )) || fail "$n ranks, $how: took $seconds s, more than $bound"
    if [[ $how == kill ]]; then
      [[ "$out" == *"process rank $victim"*"signal 9"* ]] ||
        fail "$n ranks, kill: the output does not name rank $victim as killed"
    else
      [[ "$out" == *"memwall: rank "*" has waited "*"MEMWALL_COLLECTIVE_TIMEOUT_S = 15"* ]] ||
        fail "$n ranks, stop: no rank said it timed out waiting"
      [[ "$out" != *"memwall: rank $victim:"* ]] || fail "the stopped rank cannot have reported"
    fi
  done
done
echo PASS
