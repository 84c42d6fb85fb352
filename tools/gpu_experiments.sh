#!/usr/bin/env bash
# Experiments on a GPU machine in one command, each brought back as one
# file. tools/gpu_bundle.sh ships it as experiments.sh; run it from a
# checkout's root (the experiments are read from there):
#
#   gpu_bundle/experiments.sh RESULTS_DIR repro/offload/throughput/h100.textproto ...
#
# Each experiment runs with the bundle's runner (repro_run) into a scratch
# folder, which is then packed as RESULTS_DIR/<its name>.tar.gz (data.csv,
# provenance.json, figure inputs, traces/); RESULTS_DIR/experiments.log
# holds every run's progress lines. The device tool brings back 8 files
# from a command, so at most 7 experiments; a run needs nothing else there.
# The command has a time limit (MEMWALL_SESSION_SECONDS, 560 s: under the
# device tool's 10 minutes), shared in order: an experiment gets what is
# left less 10 s, and one with under 30 s left is not started and says so.
# A run cut short still packs what it wrote (a ladder experiment's
# data.partial.csv holds every attempt that finished). Exits non-zero if a
# run failed, was cut short or was not started.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
results="${1:?usage: experiments.sh RESULTS_DIR EXPERIMENT.textproto...}"
shift
(( $# >= 1 )) || { echo "experiments.sh: name at least one experiment" >&2; exit 2; }
(( $# <= 7 )) || { echo "experiments.sh: $# experiments; at most 7 (8 files come back)" >&2; exit 2; }
for e in "$@"; do
  [[ -f "$e" ]] || { echo "experiments.sh: no $e here: run it from a checkout's root" >&2; exit 2; }
done
mkdir -p "$results"
results="$(cd "$results" && pwd)"
source "$here/env.sh"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
deadline=$(( $(date +%s) + ${MEMWALL_SESSION_SECONDS:-560} ))
log="$results/experiments.log"
: > "$log"
status=0
for e in "$@"; do
  name="$(sed -n 's/^name:[[:space:]]*"\(.*\)"/\1/p' "$e" | head -1)"
  [[ -n "$name" ]] || name="$(basename "$e" .textproto)"
  left=$(( deadline - $(date +%s) - 10 ))
  if (( left < 30 )); then
    echo "== $name ($e): not run: the command's time ran out" >> "$log"
    status=1
    continue
  fi
  echo "== $name ($e), at most ${left}s" >> "$log"
  start=$(date +%s)
  timeout "$left" "$bin/repro_run" --results_dir="$scratch" "$e" >> "$log" 2>&1
  code=$?
  echo "== $name exit $code after $(( $(date +%s) - start ))s$( (( code == 124 )) && echo ' (cut short by its limit)')" >> "$log"
  (( code == 0 )) || status=1
  if [[ -d "$scratch/$name" ]]; then
    tar -C "$scratch" -czf "$results/$name.tar.gz" "$name"
  else
    echo "== $name wrote no results folder" >> "$log"
    status=1
  fi
done
exit $status
