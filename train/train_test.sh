#!/bin/bash
# The training command with no flags but --steps (the quickstart, shortened):
# it trains, the loss falls, it writes a log line per step and a
# safetensors file with its config.json, and //models:evaluate reads that
# file back and reports a loss on the same text close to the trainer's last
# one (two independent paths to the same number). A token file of the
# text's bytes trains exactly as the text.
set -euo pipefail
out="$TEST_TMPDIR/train"
train/train --steps=60 --device=cpu --out="$out" > "$TEST_TMPDIR/stdout" 2> "$TEST_TMPDIR/stderr"
cat "$TEST_TMPDIR/stdout"
[[ $(grep -c '^step ' "$out/train.log") -eq 60 ]] || { echo "expected 60 step lines in the log"; exit 1; }
# The set-up is said before it starts (the model line) and when it is done.
sed -n '1p' "$TEST_TMPDIR/stdout" | grep -q '^train: quickstart (4 layers, hidden 128' &&
  sed -n '2p' "$TEST_TMPDIR/stdout" | grep -q '^train: set up in [0-9]*\.[0-9] s: the model states allocated and initialized ([0-9.]* [KMG]*i*B of device memory)$' ||
  { echo "the model line, then the set-up line"; exit 1; }
grep -q '"n_head": 4' "$out/config.json" || { echo "no config.json beside the weights"; exit 1; }
read -r first last < <(sed -n 's/^first loss \([0-9.]*\), last loss \([0-9.]*\).*/\1 \2/p' "$TEST_TMPDIR/stdout")
echo "first=$first last=$last"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 5.0 && l < 0.8 * f) }' || { echo "loss did not fall"; exit 1; }
eval_out=$(models/evaluate --weights="$out/model.safetensors" --text=data/quickstart.txt --device=cpu 2> "$TEST_TMPDIR/eval_stderr")
echo "$eval_out"
loss=$(echo "$eval_out" | tail -1 | sed -n 's/^loss=\([0-9.]*\)$/\1/p')
# Written to a file, evaluate's progress is whole lines, the last at the end of the text.
(( $(grep -c '^evaluate: [0-9]* / [0-9]* tokens, running loss [0-9.]*$' "$TEST_TMPDIR/eval_stderr") >= 2 )) &&
  tail -1 "$TEST_TMPDIR/eval_stderr" | grep -q '^evaluate: \([0-9]*\) / \1 tokens' ||
  { cat "$TEST_TMPDIR/eval_stderr"; echo "evaluate's progress lines"; exit 1; }
[[ -n "$loss" ]] || { echo "evaluate did not print loss=<value> last"; exit 1; }
# The trained weights fit the text: within 25% of the last training loss
# (bf16 training vs fp32 evaluation over every window, not a sampled batch).
awk -v e="$loss" -v l="$last" 'BEGIN { exit !(e < 1.25 * l && e > 0.75 * l) }' || { echo "evaluate loss $loss vs last training loss $last"; exit 1; }
# The memory line: at stage 0 on the CpuDevice the device peak is the
# estimate (engine/estimate.h), and the process holds at least that much.
memory=$(sed -n 's/^memory: *//p' "$TEST_TMPDIR/stdout")
grep -q "^memory: $memory$" "$out/train.log" || { echo "no memory line in train.log"; exit 1; }
bytes() { awk -v n="$1" -v u="$2" 'BEGIN { m = u == "B" ? 1 : u == "KiB" ? 2^10 : u == "MiB" ? 2^20 : u == "GiB" ? 2^30 : -1;
                                          if (m < 0) exit 1; printf "%.0f", n * m }'; }
read -r peak peak_unit est est_unit res res_unit < <(echo "$memory" |
  sed -n 's/^device peak \([0-9.]*\) \([KMG]*i*B\) of \([0-9.]*\) \([KMG]*i*B\) estimated; process resident peak \([0-9.]*\) \([KMG]*i*B\)$/\1 \2 \3 \4 \5 \6/p')
[[ -n "$res_unit" ]] || { echo "memory line: $memory"; exit 1; }
[[ "$peak $peak_unit" == "$est $est_unit" ]] || { echo "device peak $peak $peak_unit, estimated $est $est_unit"; exit 1; }
(( $(bytes "$res" "$res_unit") >= $(bytes "$peak" "$peak_unit") )) || { echo "resident below the device peak: $memory"; exit 1; }
# Bad input is a clear error, not a crash.
if models/evaluate --weights="$out/missing.safetensors" --heads=4 --text=data/quickstart.txt 2> "$TEST_TMPDIR/err"; then
  echo "missing weights accepted"; exit 1
fi
grep -q "safetensors file .*missing.safetensors does not exist" "$TEST_TMPDIR/err"
# Bad flags name themselves.
if train/train --steps=0 --device=cpu --out="$out" 2> "$TEST_TMPDIR/err"; then echo "--steps=0 accepted"; exit 1; fi
grep -q -- "--steps=0 must be > 0" "$TEST_TMPDIR/err"
if train/train --model=no_such_model --device=cpu --out="$out" 2> "$TEST_TMPDIR/err"; then echo "a bad model accepted"; exit 1; fi
grep -q "model 'no_such_model' is neither a file nor a model name; the names are: gpt_125m" "$TEST_TMPDIR/err"
if train/train --set='zero { offload_optimizer { device: GPU } }' --device=cpu --out="$out" 2> "$TEST_TMPDIR/err"; then
  echo "a bad enum accepted"; exit 1
fi
grep -q "device is one of NONE, CPU, NVME" "$TEST_TMPDIR/err"
if train/train --resume="$out/no_such_step" --steps=1 --device=cpu --out="$out" 2> "$TEST_TMPDIR/err"; then
  echo "a missing checkpoint accepted"; exit 1
fi
grep -q "no_such_step" "$TEST_TMPDIR/err"
# Host threads follow the CPUs the process may run on (nproc): bound to one
# CPU (as mpirun binds a lone rank), the run says so, and warns when it could
# have had more.
allowed=$(nproc)
taskset -c "$(taskset -pc $$ | sed 's/.*: *//; s/[-,].*//')" train/train --steps=1 --device=cpu --out="$out/bound" \
  --export=none > "$TEST_TMPDIR/bound.log" 2>&1 || { cat "$TEST_TMPDIR/bound.log"; echo "a run bound to one CPU"; exit 1; }
grep -q "^train: host work .*: 1 thread (1 of [0-9]* CPUs allowed, 1 rank on this machine)$" "$TEST_TMPDIR/bound.log" ||
  { cat "$TEST_TMPDIR/bound.log"; echo "no host-threads line for one CPU"; exit 1; }
if (( allowed > 1 )); then
  grep -q "warning: rank 0 may run on 1 of the [0-9]* CPUs that are its share" "$TEST_TMPDIR/bound.log" ||
    { cat "$TEST_TMPDIR/bound.log"; echo "no warning for a rank bound to one of $allowed CPUs"; exit 1; }
fi
grep -q "^train: host work .*: $allowed threads\? ($allowed of [0-9]* CPUs allowed" "$TEST_TMPDIR/stdout" ||
  { cat "$TEST_TMPDIR/stdout"; echo "an unbound run does not take its $allowed CPUs"; exit 1; }
# The start line names what a config changes: fp16's loss scaling (the
# DeepSpeed translation's hysteresis 2) and stage 3's reuse distance.
train/train --steps=1 --device=cpu --out="$out/fp16" --export=none \
  --set='precision: FP16 loss_scaling { initial_scale: 1024 hysteresis: 2 } zero { stage: 3 max_reuse_distance: 5000 }' \
  > "$TEST_TMPDIR/fp16.log" 2>&1 || { cat "$TEST_TMPDIR/fp16.log"; echo "an fp16 stage-3 run"; exit 1; }
grep -q "^train: stage 3, optimizer states on the device, parameters on the device, a module kept within 5000 elements of its next use; fp16 (loss scale 1024, x2 after 1000 clean steps, hysteresis 2); " \
  "$TEST_TMPDIR/fp16.log" || { cat "$TEST_TMPDIR/fp16.log"; echo "no fp16 and reuse in the start line"; exit 1; }
# DeepSpeed's ZeRO-Infinity parameter offload with its buffer keys: the
# parameters on NVMe, a shard's first 20000 elements in pinned host memory
# (max_in_cpu), swap buffers of 3000 elements (buffer_size); the start line
# says so, and pinned memory peaks at the estimate.
mkdir -p "$TEST_TMPDIR/nvme"
cat > "$TEST_TMPDIR/infinity.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "sub_group_size": 100000,
   "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme", "buffer_count": 4, "pin_memory": false},
   "offload_param": {"device": "nvme", "nvme_path": "$TEST_TMPDIR/nvme", "pin_memory": true, "buffer_count": 5,
                     "buffer_size": 3000, "max_in_cpu": 20000}}}
EOF
train/train --steps=2 --device=cpu --out="$out/infinity" --export=none --deepspeed_config="$TEST_TMPDIR/infinity.json" \
  > "$TEST_TMPDIR/infinity.log" 2>&1 || { cat "$TEST_TMPDIR/infinity.log"; echo "a ZeRO-Infinity DeepSpeed config"; exit 1; }
grep -q "^train: stage 3, optimizer states on CPU, parameters on NVME (a shard's first 20000 elements in pinned host memory)" \
  "$TEST_TMPDIR/infinity.log" || { cat "$TEST_TMPDIR/infinity.log"; echo "no host part in the start line"; exit 1; }
grep -q "offload_param.buffer_size = 3000 -> zero.offload_param.buffer_elements" "$TEST_TMPDIR/infinity.log" ||
  { cat "$TEST_TMPDIR/infinity.log"; echo "no buffer_size line"; exit 1; }
grep -Eq "pinned host peak ([0-9.]+ [KMG]iB) of \1 estimated" "$TEST_TMPDIR/infinity.log" ||
  { cat "$TEST_TMPDIR/infinity.log"; echo "the pinned peak is not the estimate"; exit 1; }
# A model file named bare, as a user types it in their directory.
mkdir -p "$TEST_TMPDIR/user"
printf 'name: "mine" layers: 1 hidden: 64 heads: 2 vocab: 256 positions: 32\n' > "$TEST_TMPDIR/user/mine.textproto"
# As under `bazel run`, the evaluate line names the project's text in the
# user's checkout (BUILD_WORKSPACE_DIRECTORY), not in the binary's runfiles.
BUILD_WORKING_DIRECTORY="$TEST_TMPDIR/user" BUILD_WORKSPACE_DIRECTORY="$TEST_TMPDIR/checkout" train/train \
  --model=mine.textproto --steps=1 --device=cpu --out="$out/mine" > "$TEST_TMPDIR/mine.log" 2>&1 ||
  { cat "$TEST_TMPDIR/mine.log"; echo "a bare model file"; exit 1; }
grep -q "train: mine (1 layers, hidden 64, 2 heads" "$TEST_TMPDIR/mine.log"
grep -q "^evaluate: .* --text=$TEST_TMPDIR/checkout/data/quickstart.txt$" "$TEST_TMPDIR/mine.log" ||
  { cat "$TEST_TMPDIR/mine.log"; echo "the evaluate line does not name the checkout's text"; exit 1; }
# Saving over checkpoints it did not resume from is refused before training.
train/train --steps=2 --save_every=2 --device=cpu --out="$out/saved" > /dev/null 2>&1
if train/train --steps=2 --save_every=2 --device=cpu --out="$out/saved" 2> "$TEST_TMPDIR/err"; then
  echo "saved over old checkpoints"; exit 1
fi
grep -q "holds checkpoints (the latest .*step_00000002): pass --resume" "$TEST_TMPDIR/err"
# --keep_checkpoints=2 keeps the newest two complete saves; a resume from
# them continues, and the next save deletes the older one again.
train/train --steps=5 --save_every=1 --keep_checkpoints=2 --device=cpu --out="$out/keep" > /dev/null 2>&1 ||
  { echo "a run that keeps 2 checkpoints"; exit 1; }
kept=$(cd "$out/keep/checkpoints" && echo step_*)
[[ "$kept" == "step_00000004 step_00000005" ]] || { echo "kept: $kept"; exit 1; }
grep -q "deleted .*step_00000003" "$out/keep/train.log" || { echo "no deletion logged"; exit 1; }
train/train --steps=6 --save_every=1 --keep_checkpoints=2 --device=cpu --out="$out/keep" --resume > /dev/null 2>&1 ||
  { echo "resuming a run that keeps 2 checkpoints"; exit 1; }
kept=$(cd "$out/keep/checkpoints" && echo step_*)
[[ "$kept" == "step_00000005 step_00000006" ]] || { echo "kept after resuming: $kept"; exit 1; }
# Resumed from an older step, its saves would meet the newer checkpoints:
# refused before training, naming the newer one; nothing is changed.
if train/train --steps=7 --save_every=1 --device=cpu --out="$out/keep" \
     --resume="$out/keep/checkpoints/step_00000005" 2> "$TEST_TMPDIR/err"; then
  echo "resumed below newer checkpoints"; exit 1
fi
grep -q "holds .*step_00000006, newer than step 5 that this run resumed from" "$TEST_TMPDIR/err" ||
  { cat "$TEST_TMPDIR/err"; echo "resuming below newer checkpoints"; exit 1; }
[[ "$(cd "$out/keep/checkpoints" && echo step_*)" == "step_00000005 step_00000006" ]] || { echo "a refused run saved"; exit 1; }
# A step typed without its padding points at the one that is there.
if train/train --steps=7 --device=cpu --out="$out/keep" --resume="$out/keep/checkpoints/step_5" 2> "$TEST_TMPDIR/err"; then
  echo "resumed from a step that is not there"; exit 1
fi
grep -q "no such path; step 5's checkpoint is .*checkpoints/step_00000005" "$TEST_TMPDIR/err" ||
  { cat "$TEST_TMPDIR/err"; echo "no hint for step_5"; exit 1; }
# Every directory the run writes is checked before it trains: a file where
# --export or --save_dir wants a directory is refused, and no step runs.
for bad in "--export=$TEST_TMPDIR/stdout|--export $TEST_TMPDIR/stdout: it or a parent is a file" \
           "--save_every=1 --save_dir=$TEST_TMPDIR/stdout/ck|--save_dir $TEST_TMPDIR/stdout/ck: it or a parent is a file"; do
  if train/train --steps=1 --device=cpu --out="$out/bad_dir" ${bad%%|*} 2> "$TEST_TMPDIR/err"; then
    echo "accepted ${bad%%|*}"; exit 1
  fi
  grep -q -- "${bad#*|}" "$TEST_TMPDIR/err" || { cat "$TEST_TMPDIR/err"; echo "refusal of ${bad%%|*}"; exit 1; }
  [[ ! -e "$out/bad_dir/train.log" ]] || { echo "trained before refusing ${bad%%|*}"; exit 1; }
done
for bad in "--keep_checkpoints=-1 --save_every=1|--keep_checkpoints=-1 must be >= 0" \
           "--keep_checkpoints=2|--keep_checkpoints needs --save_every" \
           "--print_every=-3|--print_every=-3 must be >= 0"; do
  if train/train --steps=1 --device=cpu --out="$out/bad_keep" ${bad%%|*} 2> "$TEST_TMPDIR/err"; then
    echo "accepted ${bad%%|*}"; exit 1
  fi
  grep -q -- "${bad#*|}" "$TEST_TMPDIR/err" || { cat "$TEST_TMPDIR/err"; echo "refusal of ${bad%%|*}"; exit 1; }
done
# A token file of the text's bytes as uint16 ids trains exactly as the text.
/usr/bin/python3 -c 'import sys; open(sys.argv[2], "wb").write(b"".join(bytes([c, 0]) for c in open(sys.argv[1], "rb").read()))' \
  data/quickstart.txt "$TEST_TMPDIR/quickstart.bin"
train/train --steps=3 --device=cpu --out="$out/text" > "$TEST_TMPDIR/text.log" 2>&1
train/train --steps=3 --device=cpu --out="$out/tokens" --data="$TEST_TMPDIR/quickstart.bin" > "$TEST_TMPDIR/tokens.log" 2>&1 ||
  { cat "$TEST_TMPDIR/tokens.log"; echo "a token file"; exit 1; }
text_losses=$(grep -o "first loss .*, last loss [0-9.]*" "$TEST_TMPDIR/text.log")
[[ -n "$text_losses" && "$(grep -o "first loss .*, last loss [0-9.]*" "$TEST_TMPDIR/tokens.log")" == "$text_losses" ]] ||
  { echo "the token file trained differently: $(grep "first loss" "$TEST_TMPDIR/tokens.log") vs $text_losses"; exit 1; }
# Text read as ids: ids beyond the model's vocabulary are refused, named.
if train/train --steps=1 --device=cpu --out="$out/wrong" --data=data/quickstart.txt --data_format=uint16 2> "$TEST_TMPDIR/err"; then
  echo "text read as token ids accepted"; exit 1
fi
grep -q "quickstart.txt has a vocabulary of [0-9]*; the model's is 256" "$TEST_TMPDIR/err"
if train/train --steps=1 --device=cpu --out="$out/wrong" --data_format=u16 2> "$TEST_TMPDIR/err"; then
  echo "a bad --data_format accepted"; exit 1
fi
grep -q "data format 'u16' is not one of auto, text, uint16" "$TEST_TMPDIR/err"
if train/train --steps=1 --device=cpu --out="$out/wrong" --comm_backend=gloo 2> "$TEST_TMPDIR/err"; then
  echo "a bad --comm_backend accepted"; exit 1
fi
grep -q "communication backend 'gloo' is not one of auto, mpi, nccl, tcp" "$TEST_TMPDIR/err"
echo PASS
