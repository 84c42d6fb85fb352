#!/bin/bash
# Runs fuzz targets under libFuzzer (clang, ASan + UBSan) and records what
# they did in results/fuzz/<target>.txt: executions, crashes (none, or the
# run fails), corpus size, commit, machine, date and command.
#   tools/fuzz.sh [RUNS] [//pkg:target ...]    (default: 1000000 runs, every target)
# Each target starts from its checked-in corpus (<pkg>/<target>_corpus/);
# new inputs libFuzzer finds go to a scratch corpus, not the repository. A
# crash leaves its input in results/fuzz/ (crash-<sha1>): fix the bug, then
# add the input to the target's corpus so that CI replays it.
# Needs Debian's clang-14 (apt-get install clang-14).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-1000000}"; shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(./bazelw query --output=label 'attr(tags, manual, kind(cc_binary, //...)) intersect attr(name, "_fuzzer$", //...)' 2>/dev/null)
fi
command -v clang-14 >/dev/null || { echo "fuzz.sh: needs clang-14 (apt-get install clang-14)" >&2; exit 1; }
base="${MEMWALL_FUZZ_OUTPUT_BASE:-$HOME/.cache/memwall-fuzz}"
./bazelw --output_base="$base" build --config=fuzz --symlink_prefix=/ "${targets[@]}"
bin="$(./bazelw --output_base="$base" info --config=fuzz bazel-bin 2>/dev/null)"
mkdir -p results/fuzz
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)"
machine="$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
for t in "${targets[@]}"; do
  pkg="${t#//}"; pkg="${pkg%%:*}"; name="${t##*:}"
  seeds="$pkg/${name}_corpus"
  scratch="$(mktemp -d)"
  cp "$seeds"/* "$scratch"/
  log="$(mktemp)"
  echo "=== $t: $runs runs from $(ls "$seeds" | wc -l) seeds"
  start=$(date +%s)
  set +e
  "$bin/$pkg/$name" -runs="$runs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix=results/fuzz/ "$scratch" >"$log" 2>&1
  code=$?
  set -e
  seconds=$(( $(date +%s) - start ))
  execs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)"
  cat >"results/fuzz/$name.txt" <<EOT
target: $t
executions: $execs
exit: $code ($( ((code == 0)) && echo "no crash, hang or sanitizer report" || echo "FINDING: see results/fuzz/$name.log"))
seed corpus: $(ls "$seeds" | wc -l) inputs ($seeds)
corpus after: $(ls "$scratch" | wc -l) inputs
seconds: $seconds
commit: $commit
machine: $machine
date: $(date -u +%Y-%m-%dT%H:%M:%SZ)
command: tools/fuzz.sh $runs $t
EOT
  rm -rf "$scratch"
  cat "results/fuzz/$name.txt"
  if ((code != 0)); then
    cp "$log" "results/fuzz/$name.log"
    echo "fuzz.sh: $t failed (exit $code): results/fuzz/$name.log" >&2
    exit 1
  fi
  rm -f "$log"
done
