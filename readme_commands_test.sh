#!/bin/bash
# Every `./bazelw run` command the READMEs show (the root's and each
# package's, tools/readme_commands.py), run as `bazel run` runs them: each
# binary starts in a directory that holds none of the user's files (Bazel's
# runfiles tree), BUILD_WORKING_DIRECTORY names the directory the user typed
# the command in (a stand-in for the repository root), and relative paths on
# the command line must be found there. Placeholders are filled in
# (F.safetensors: weights //:train wrote; N: 4; FILE: data/quickstart.txt).
# Commands left out, and why:
#   //:train with no flags  300 steps (~90 s); its short run is train_test
#                           (here it runs 2 steps to write the weights); a
#                           //:train command with --steps runs as shown
#   *_benchmark             timing, not correctness
#   //repro:<experiment>, //repro:run  their own tests on CI-size experiments
#                           (zero_memory_test, offload_max_model_test, ...)
#   //zero:consolidate      needs a sharded checkpoint; checkpoint_phases_test
# //repro:estimate exits 1 when a run does not fit (a README may show one
# that does not): that counts as run when it says DOES NOT FIT.
set -uo pipefail
root=$PWD                                  # runfiles: README.md, the binaries, data
user="$TEST_TMPDIR/checkout"               # where the user stands
elsewhere="$TEST_TMPDIR/runfiles_cwd"      # where the binary starts: no user files
mkdir -p "$user/models/configs" "$user/data" "$elsewhere"
cp models/configs/*.textproto "$user/models/configs/"
cp data/quickstart.txt "$user/data/"
fail() { echo "FAIL: $*"; exit 1; }

# Weights for //models:evaluate, written through a relative --out.
(cd "$root" && BUILD_WORKING_DIRECTORY="$user" BUILD_WORKSPACE_DIRECTORY="$user" \
  train/train --steps=2 --device=cpu --out=out/train > "$TEST_TMPDIR/train.log" 2>&1) ||
  { cat "$TEST_TMPDIR/train.log"; fail "train --out=out/train"; }
[[ -f "$user/out/train/model.safetensors" ]] || fail "a relative --out did not land in the user's directory"

ran=()
while IFS= read -r line; do
  cmd=${line%%#*}                               # drop the comment
  eval "words=($cmd)"                          # as the shell splits it, quotes included
  target=${words[2]}
  args=("${words[@]:3}")
  [[ ${args[0]:-} == "--" ]] && args=("${args[@]:1}")
  case "$target" in
    //:train) [[ " ${args[*]} " == *" --steps="* ]] || { echo "skip: $target (300 steps)"; continue; } ;;
    //repro:zero_memory|//repro:offload_*|//repro:run|*_benchmark|//zero:consolidate)
      echo "skip: $target"; continue ;;
  esac
  for i in "${!args[@]}"; do
    a=${args[$i]//F.safetensors/out/train/model.safetensors}
    a=${a//=FILE/=data/quickstart.txt}
    args[$i]=${a//=N/=4}
  done
  bin="$root/${target#//}"
  bin=${bin/://}
  [[ $target == //:train ]] && bin="$root/train/train"   # the alias's binary
  echo "run: $target ${args[*]}"
  (cd "$elsewhere" && BUILD_WORKING_DIRECTORY="$user" BUILD_WORKSPACE_DIRECTORY="$user" \
    "$bin" "${args[@]}" > "$TEST_TMPDIR/out.log" 2>&1)
  code=$?
  cat "$TEST_TMPDIR/out.log"
  if [[ $code -eq 1 && $target == //repro:estimate ]] && grep -q "DOES NOT FIT" "$TEST_TMPDIR/out.log"; then
    code=0
  fi
  [[ $code -eq 0 ]] || fail "$target ${args[*]} exited $code"
  ran+=("$target")
done < <(python3 tools/readme_commands.py README.md */README.md)

for want in //repro:estimate //models:evaluate //runtime:selfcheck; do
  [[ " ${ran[*]} " == *" $want "* ]] || fail "the README shows no './bazelw run $want' command to run"
done
echo "PASS: ${#ran[@]} README commands"
