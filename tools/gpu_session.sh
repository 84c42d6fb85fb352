#!/usr/bin/env bash
# One visit to a GPU machine, in about ten minutes, building nothing there:
# every `gpu` test, the per-kernel breakdown and the model TFLOPS rows of
# gpt_benchmark, and one offload run (ZeRO-Offload Figure 9 on this GPU:
# repro/offload/dpu/gpu.textproto). tools/gpu_bundle.sh ships it as
# session.sh; run it from a checkout's root (the offload experiment is read
# from there):
#
#   gpu_bundle/session.sh RESULTS_DIR
#
# Afterwards RESULTS_DIR holds eight files, the most the device tool
# brings back from one command (so a command that runs this writes nothing
# else there):
#   RESULTS_DIR/summary.md  one page: what passed, each model's TFLOPS
#                         against the GEMM rate measured in the same run,
#                         where a step's time goes, each op alone against
#                         its bound, the offload modes' TFLOPS
#   machine.txt           the bundle's MANIFEST, CPU, GPU, driver, libraries
#   tests.log             every test's output, in order
#   gpt_benchmark.json    BM_GptCuda* rows (Google Benchmark's JSON)
#   ops_benchmark.json    each op at the 1.3B GPT's shapes (ops/ops_benchmark.cc)
#   benchmarks.log        both benchmarks' console output, then the offload
#                         run's progress lines
#   offload_dpu_gpu.csv   the offload run's data.csv
#   offload_dpu_gpu.tar.gz  its results folder: data.csv, provenance.json,
#                         traces/ (each step's Chrome trace)
# Each part has a time limit (MEMWALL_TEST_SECONDS per test binary, 150 by
# default; MEMWALL_BENCH_SECONDS for gpt_benchmark, 240; MEMWALL_OPS_BENCH_SECONDS
# for ops_benchmark, 90; MEMWALL_OFFLOAD_SECONDS for the offload run, 150), so a
# hang costs one part, not the visit. MEMWALL_BENCH_FILTER narrows
# gpt_benchmark's rows (a regular expression, BM_GptCuda by default: e.g.
# 'BM_GptCuda.*/gpt_1_3b' for the 1.3B's rows and breakdown; all rows took
# 137 s on an H100). MEMWALL_OFFLOAD_SECONDS=0 skips the
# offload run (six files then; the rest of the command's time and its two
# files can go to experiments.sh). The visit has a limit too
# (MEMWALL_SESSION_SECONDS, 560: under the 10 minutes one command may run
# there), so the summary is always written: a part gets at most what is left
# of it less 15 s, and one with under 10 s left is not started and says so.
# Exits non-zero if a test failed or a part did not finish.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
results="${1:?usage: session.sh RESULTS_DIR}"
mkdir -p "$results"
results="$(cd "$results" && pwd)"
source "$here/env.sh"
scratch="$(mktemp -d)"
status=0
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started ))s; }
deadline=$(( started + ${MEMWALL_SESSION_SECONDS:-560} ))
# Seconds a part may run: its own limit $1, cut to the visit's time left
# less 15 s for the summary; 0 (do not start it) under 10 s.
limit() {
  local left=$(( deadline - $(date +%s) - 15 ))
  (( left > $1 )) && left=$1
  if (( left >= 10 )); then echo "$left"; else echo 0; fi
}
not_run="not run: the visit's time ran out"

{
  cat "$here/MANIFEST"
  echo "host: $(hostname)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)  cores: $(nproc)"
  echo "memory: $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "nccl: ${nccl_dir:-not found}  cublas: ${cublas_dir:-not found}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$results/machine.txt"

# 1. Every gpu test: single-process ones directly, multi-rank ones (NAME_bin)
#    as 2 ranks through launch.sh. JUnit XML goes to scratch for the summary.
: > "$results/tests.log"
for binary in "$bin"/*_test "$bin"/*_test_bin; do
  [[ -e "$binary" ]] || continue
  name="$(basename "$binary")"
  launch=()
  xml="$scratch/xml/$name.xml"
  if [[ "$name" == *_test_bin ]]; then
    launch=("$here/launch.sh" 2)
    xml="$scratch/xml/${name%_bin}_rank{rank}.xml"
  fi
  mkdir -p "$scratch/xml"
  seconds=$(limit "${MEMWALL_TEST_SECONDS:-150}")
  if (( seconds == 0 )); then
    echo "== $name $not_run" >> "$results/tests.log"
    status=1
    continue
  fi
  echo "== $name ($(elapsed))" >> "$results/tests.log"
  # A fresh TEST_TMPDIR for each binary, shared by its ranks, as Bazel gives a test.
  tmpdir="$(mktemp -d "$scratch/tmp.XXXXXX")"
  TEST_TMPDIR="$tmpdir" timeout "$seconds" "${launch[@]}" "$binary" --gtest_output="xml:$xml" \
    >> "$results/tests.log" 2>&1
  code=$?
  echo "== $name exit $code" >> "$results/tests.log"
  (( code == 0 )) || status=1
done

# 1b. If a GEMM test failed, its CUDA cases once more under cuBLASLt's trace
#     (CUBLASLT_LOG_LEVEL=2: each launch with its algorithm's tile, split-K
#     and reduction scheme), the last 200 lines into tests.log, so a
#     wrong result comes back with the algorithm that gave it.
if grep -q "^== mixed_precision_test exit [1-9]" "$results/tests.log"; then
  seconds=$(limit 30)
  if (( seconds > 0 )); then
    echo "== mixed_precision_test CudaOps.Matmul* under CUBLASLT_LOG_LEVEL=2 (last 200 lines)" >> "$results/tests.log"
    TEST_TMPDIR="$(mktemp -d "$scratch/tmp.XXXXXX")" CUBLASLT_LOG_LEVEL=2 timeout "$seconds" \
      "$bin/mixed_precision_test" --gtest_filter='CudaOps.Matmul*' 2>&1 | tail -n 200 >> "$results/tests.log"
  fi
fi

# 2. gpt_benchmark: the breakdown and the model rows against the GEMM rate;
#    ops_benchmark: each op alone against its bound.
#    A row finished before a limit stays in the JSON (the summary reads a
#    file cut short).
: > "$results/benchmarks.log"
# part NAME LIMIT LOG COMMAND...: COMMAND under the part's limit, or a line
# in LOG saying it was not run.
part() {
  local name="$1" seconds log="$3"
  seconds=$(limit "$2")
  shift 3
  if (( seconds == 0 )); then
    echo "$name $not_run" >> "$log"
    status=1
    return
  fi
  timeout "$seconds" "$@" >> "$log" 2>&1 || status=1
}
part gpt_benchmark "${MEMWALL_BENCH_SECONDS:-240}" "$results/benchmarks.log" \
  "$bin/gpt_benchmark" --benchmark_filter="${MEMWALL_BENCH_FILTER:-BM_GptCuda}" \
  --benchmark_out="$results/gpt_benchmark.json" --benchmark_out_format=json
part ops_benchmark "${MEMWALL_OPS_BENCH_SECONDS:-90}" "$results/benchmarks.log" \
  "$bin/ops_benchmark" --benchmark_out="$results/ops_benchmark.json" --benchmark_out_format=json

# 3. The offload run (a checkout's experiment file, this bundle's runner).
experiment="repro/offload/dpu/gpu.textproto"
if [[ "${MEMWALL_OFFLOAD_SECONDS:-150}" == 0 ]]; then
  echo "== repro_run $experiment skipped: MEMWALL_OFFLOAD_SECONDS=0" >> "$results/benchmarks.log"
elif [[ -f "$experiment" ]]; then
  echo "== repro_run $experiment" >> "$results/benchmarks.log"
  part repro_run "${MEMWALL_OFFLOAD_SECONDS:-150}" "$results/benchmarks.log" \
    "$bin/repro_run" --results_dir="$scratch/repro" "$experiment"
  cp "$scratch/repro/offload_dpu_gpu/data.csv" "$results/offload_dpu_gpu.csv" 2>/dev/null
  # The whole results folder (provenance, figure inputs, every step's trace) as one file.
  [[ -d "$scratch/repro/offload_dpu_gpu" ]] &&
    tar -C "$scratch/repro" -czf "$results/offload_dpu_gpu.tar.gz" offload_dpu_gpu
else
  echo "no $experiment here: run session.sh from a checkout's root" >> "$results/benchmarks.log"
  status=1
fi

# 4. The one-page summary.
python3 "$here/gpu_summary.py" "$results" "$scratch/xml" "$(elapsed)" > "$results/summary.md" 2>&1 \
  || { echo "summary failed; the raw files are beside it" >> "$results/summary.md"; status=1; }
rm -rf "$scratch"
cat "$results/summary.md"
exit $status
