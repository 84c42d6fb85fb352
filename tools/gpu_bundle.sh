#!/usr/bin/env bash
# Builds memwall's GPU test, benchmark and self-check binaries here (where
# Bazel and the CUDA toolkit are) and packs them, with the shared libraries a
# GPU machine lacks, into one folder that runs there without Bazel.
# See docs/build.md.
#
#   tools/gpu_bundle.sh [OUT_DIR]          (default: gpu_bundle/, git-ignored)
#   OUT_DIR/session.sh RESULTS_DIR         (on the GPU machine, from a checkout's root: one
#                                          visit, ~10 minutes, 8 files with RESULTS_DIR/summary.md; see gpu_session.sh)
#   OUT_DIR/experiments.sh RESULTS_DIR EXPERIMENT.textproto...
#                                          (on the GPU machine, from a checkout's root: each
#                                          experiment back as one tarball; see gpu_experiments.sh)
#   OUT_DIR/run.sh RESULTS_DIR [NAME...]   (on the GPU machine)
#   source OUT_DIR/env.sh; "$bin"/repro_run --results_dir=DIR repro/<paper>/<result>/experiment.textproto
#                                          (an experiment on the GPU machine, from a checkout's root)
#
# Contents: payload.tar.xz (unpacked by env.sh beside itself, or into a
# temporary folder where the bundle is read-only: bin/, our code linked
# statically, repro_run being //repro:run; lib/, Abseil, protobuf, OpenMPI,
# OpenBLAS, ... as found by ldd, and libcudart, which is small and must
# match the build), launch.sh (starts N ranks of a binary with
# torchrun-style variables), env.sh (the library path, $bin for the
# binaries' folder and MEMWALL_COMMIT for provenance), run.sh, session.sh,
# experiments.sh, MANIFEST (what was built, from which commit).
# The driver (libcuda), cuBLAS and NCCL come from the GPU machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-gpu_bundle}"

# What goes in: every test tagged `gpu` (a multi-rank one as its gtest
# binary, NAME_bin, which run.sh starts at 2 ranks), every benchmark, the
# self-check.
mapfile -t tests < <(./bazelw query --noshow_progress 'attr(tags, "\bgpu\b", kind(cc_test, //...))' 2>/dev/null)
mapfile -t rank_tests < <(./bazelw query --noshow_progress 'attr(tags, "\bgpu\b", kind(cc_binary, //...))' 2>/dev/null)
mapfile -t benchmarks < <(./bazelw query --noshow_progress 'attr(tags, "\bbenchmark\b", kind(cc_binary, //...))' 2>/dev/null)
targets=("${tests[@]}" "${rank_tests[@]}" "${benchmarks[@]}" //runtime:selfcheck)
echo "gpu_bundle: building ${#targets[@]} targets: ${targets[*]}" >&2
./bazelw build --noshow_progress "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}"; do
  path="bazel-bin/$(sed -e 's|^//||' -e 's|:|/|' <<<"$t")"
  cp -L "$path" "$out/bin/"
done
# The experiment runner, under a name that says so (run.sh leaves it out).
./bazelw build --noshow_progress //repro:run
cp -L bazel-bin/repro/run "$out/bin/repro_run"
# Multi-rank jobs: the GPU machine has no MPI, so ranks are started with
# torchrun-style variables (the TCP backend, host-staged on a GPU).
cp tools/torchrun_test_runner.sh "$out/launch.sh"
# One visit's command and its one-page summary (tools/gpu_session.sh).
cp tools/gpu_session.sh "$out/session.sh"
cp tools/gpu_experiments.sh "$out/experiments.sh"
cp tools/gpu_summary.py "$out/gpu_summary.py"
# Symbols are not needed there and halve the binaries (the device tool
# carries at most 64 MiB, repository included).
chmod u+w "$out"/bin/*
strip "$out"/bin/*

# Shared libraries: everything ldd resolves except the C runtime, the CUDA
# driver/toolkit libraries the GPU machine provides, and NCCL.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libnccl)'
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done
# OpenMPI loads its components at MPI_Init, which only mpirun's ranks call:
# the components are not bundled, and launch.sh's ranks use TCP instead.
# Binaries and libraries travel as one xz archive: about 95 MiB unpacked
# (Debian's OpenBLAS alone is 35 MiB; the statically linked binaries repeat
# our code), 11 MiB packed, since xz's window finds what the binaries share
# (gzip: 29 MiB). The device tool carries 64 MiB with the repository.
echo "gpu_bundle: packing bin/ and lib/ (xz)" >&2
tar -C "$out" -cf - bin lib | xz -T0 -6 > "$out/payload.tar.xz"
rm -rf "$out/bin" "$out/lib"

{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo "cuda archs: $(grep -o 'MEMWALL_CUDA_ARCHS=[0-9,]*' .bazelrc | head -1)"
  echo "targets: ${targets[*]}"
} > "$out/MANIFEST"

cat > "$out/env.sh" <<'ENV'
# Sourced on the GPU machine: the bundle's libraries, the machine's NCCL and
# cuBLAS on LD_LIBRARY_PATH; MEMWALL_COMMIT (the build's commit) for the
# provenance the repro runner writes off a git checkout.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# bin/ and lib/ from payload.tar.xz, once: beside it, or in a temporary
# folder when the bundle is read-only ($bin says where). Python's tarfile
# reads xz where the machine has no xz.
unpacked="$here"
if [[ ! -d "$here/bin" ]]; then
  [[ -w "$here" ]] || unpacked="$(mktemp -d)"
  python3 -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' \
      "$here/payload.tar.xz" "$unpacked" 2>/dev/null ||
    tar -C "$unpacked" -xJf "$here/payload.tar.xz" ||
    echo "env.sh: cannot unpack $here/payload.tar.xz" >&2
fi
bin="$unpacked/bin"
lib="$unpacked/lib"
# NCCL: a system copy, else the one pip's nvidia-nccl package ships.
nccl_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [[ -e "$d/libnccl.so.2" ]] && { nccl_dir="$d"; break; }
done
if [[ -z "$nccl_dir" ]]; then
  for py in python3 /usr/bin/python3; do
    d="$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)" && [[ -e "$d/libnccl.so.2" ]] && { nccl_dir="$d"; break; }
  done
fi
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e "$d/libcublas.so.13" ]] && { cublas_dir="$d"; break; }
done
export LD_LIBRARY_PATH="$lib${nccl_dir:+:$nccl_dir}${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MEMWALL_COMMIT="$(sed -n 's/^commit: //p' "$here/MANIFEST")"
export MEMWALL_COMMIT
ENV

cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs bundled memwall binaries on a GPU machine.
#   run.sh RESULTS_DIR [NAME...]   (default: every test, benchmark and the self-check in bin/)
# Tests (*_test) write RESULTS_DIR/NAME.xml, benchmarks (*_benchmark)
# RESULTS_DIR/NAME.json; every binary's output goes to RESULTS_DIR/NAME.log.
# A multi-rank test (*_test_bin) runs as MEMWALL_RANKS ranks (default 2) on
# this machine's GPUs through launch.sh, writing NAME_npN_rankR.xml.
# Exits non-zero if any binary fails.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
results="${1:?usage: run.sh RESULTS_DIR [NAME...]}"; shift
mkdir -p "$results"
source "$here/env.sh"
{
  echo "== machine"
  cat "$here/MANIFEST"
  echo "host: $(hostname)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)  cores: $(nproc)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "nccl: ${nccl_dir:-not found}  cublas: ${cublas_dir:-not found}"
} | tee "$results/machine.txt"
names=("$@")
[[ ${#names[@]} -eq 0 ]] && names=($(ls "$bin" | grep -v '^repro_run$'))
status=0
for name in "${names[@]}"; do
  binary="$bin/$name"
  args=()
  launch=()
  case "$name" in
    *_test) args=(--gtest_output="xml:$results/$name.xml") ;;
    *_test_bin)
      n="${MEMWALL_RANKS:-2}"
      launch=("$here/launch.sh" "$n")
      args=(--gtest_output="xml:$results/${name%_bin}_np${n}_rank{rank}.xml") ;;
    *_benchmark) args=(--benchmark_out="$results/$name.json" --benchmark_out_format=json) ;;
  esac
  echo "== $name${launch:+ (${launch[1]} ranks)}"
  # A fresh TEST_TMPDIR for each binary, shared by its ranks, as Bazel gives a test.
  if TEST_TMPDIR="$(mktemp -d)" "${launch[@]}" "$binary" "${args[@]}" > "$results/$name.log" 2>&1; then
    echo "   ok"; tail -n 3 "$results/$name.log"
  else
    echo "   FAILED (exit $?)"; tail -n 30 "$results/$name.log"; status=1
  fi
done
exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out" | awk '{ print "gpu_bundle: " $1 " in '"$out"'" }' >&2
if (( $(du -sb "$out" | cut -f1) > 60 * 1024 * 1024 )); then
  echo "gpu_bundle: warning: over 60 MiB; with the repository it may not fit the device tool's 64 MiB" >&2
fi
