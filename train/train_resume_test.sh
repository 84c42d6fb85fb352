#!/bin/bash
# The training command end to end on 2 ranks under mpirun, stage 2 with the
# optimizer on the CPU (ZeRO-Offload):
#   1. an uninterrupted run of 24 steps, saving every 4: the reference (the
#      learning rates step for step as DeepSpeed's, schedule.convention
#      DEEPSPEED, so a resume must restore the count of applied steps);
#   2. the same command killed (SIGKILL, every rank) once step 8 is saved,
#      then run again with --resume: it resumes from a saved step and ends
#      with the reference's weights, byte for byte;
#   3. the same run from a DeepSpeed JSON config that says the same things:
#      the translation is printed and the weights are the reference's;
#   4. torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and no
#      MPI: the job trains as 2 ranks (TCP backend) and ends with the
#      reference's weights;
#   5. the export carries config.json, and //models:evaluate refuses a
#      --heads that contradicts it;
#   6. SIGUSR1 to mpirun (what Slurm's --signal sends before a time limit)
#      stops both ranks after the same step with a complete checkpoint and
#      exit code 138; the same command with --resume ends with the
#      reference's weights. One process stopped by SIGTERM exits 143 with a
#      complete checkpoint of the step it stopped after, the only one kept
#      under --keep_checkpoints=1.
# Usage: train_resume_test.sh TRAIN EVALUATE MPI_RUNNER TORCHRUN_RUNNER
set -uo pipefail
train="$PWD/$1" evaluate="$PWD/$2" mpi="$PWD/$3" torchrun="$PWD/$4"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
flags=(--steps=24 --save_every=4 --device=cpu
       --set='zero { stage: 2 offload_optimizer { device: CPU } } schedule { convention: DEEPSPEED }')

echo "=== 1. uninterrupted"
"$mpi" 2 "$train" "${flags[@]}" --out="$tmp/ref" > "$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; fail "reference run"; }
grep -q "stage 2, optimizer states on CPU" "$tmp/ref.log" || { cat "$tmp/ref.log"; fail "no placement line"; }
grep -q "2 ranks" "$tmp/ref.log" || fail "the reference did not run on 2 ranks"
[[ -f "$tmp/ref/checkpoints/step_00000024/COMPLETE" ]] || fail "no checkpoint at step 24"

echo "=== 2. killed after step 8 is saved, then --resume"
setsid "$mpi" 2 "$train" "${flags[@]}" --out="$tmp/killed" > "$tmp/killed.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  [[ -f "$tmp/killed/checkpoints/step_00000008/COMPLETE" ]] && break
  sleep 0.1
done
kill -KILL -- "-$job" 2>/dev/null
wait "$job" 2>/dev/null
[[ -f "$tmp/killed/checkpoints/step_00000008/COMPLETE" ]] || { cat "$tmp/killed.log"; fail "step 8 was never saved"; }
[[ ! -f "$tmp/killed/model.safetensors" ]] || fail "the run finished before it was killed: nothing was resumed"
"$mpi" 2 "$train" "${flags[@]}" --out="$tmp/killed" --resume > "$tmp/resumed.log" 2>&1 ||
  { cat "$tmp/resumed.log"; fail "resumed run"; }
grep -E "resumed from .*step_000000(08|12|16|20) at step" "$tmp/resumed.log" || { cat "$tmp/resumed.log"; fail "did not resume"; }
cmp "$tmp/ref/model.safetensors" "$tmp/killed/model.safetensors" || fail "the resumed weights differ from the uninterrupted run's"

echo "=== 3. the same run from a DeepSpeed config"
cat > "$tmp/ds_config.json" <<'JSON'
{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "train_batch_size": 16,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"total_num_steps": 24, "warmup_num_steps": 20, "warmup_type": "linear",
                           "warmup_min_ratio": 0, "cos_min_ratio": 0.1}}
}
JSON
"$mpi" 2 "$train" --steps=24 --device=cpu --deepspeed_config="$tmp/ds_config.json" --out="$tmp/ds" > "$tmp/ds.log" 2>&1 ||
  { cat "$tmp/ds.log"; fail "DeepSpeed config run"; }
grep -q "deepspeed_config: zero_optimization.stage = 2 -> zero.stage" "$tmp/ds.log" || { cat "$tmp/ds.log"; fail "no translation printed"; }
cmp "$tmp/ref/model.safetensors" "$tmp/ds/model.safetensors" || fail "the DeepSpeed config trained other weights"
echo '{"zero_optimization": {"stage": 2, "round_robin_gradients": true}}' > "$tmp/bad.json"
"$train" --steps=1 --device=cpu --deepspeed_config="$tmp/bad.json" --out="$tmp/bad" > "$tmp/bad.log" 2>&1 && fail "a key memwall cannot honour was accepted"
grep -q "zero_optimization.round_robin_gradients: not implemented; set it to false" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "refusal"; }
# What the translation set, refused with --set on top: the line that set it
# is printed before the refusal.
echo "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$tmp\"}}}" \
  > "$tmp/nvme.json"
"$train" --steps=1 --device=cpu --deepspeed_config="$tmp/nvme.json" --out="$tmp/nvme" \
  --set='zero { offload_optimizer { delayed_update_after_steps: 5 } }' > "$tmp/nvme.log" 2>&1 &&
  fail "the delayed update with the translation's gradients on NVMe was accepted"
set_line="$(grep -n 'at stage 3 -> zero.offload_optimizer.gradients_on_nvme: true' "$tmp/nvme.log" | cut -d: -f1)"
refusal_line="$(grep -n 'gradients_on_nvme = true with delayed_update_after_steps = 5' "$tmp/nvme.log" | cut -d: -f1)"
[[ -n "$set_line" && -n "$refusal_line" && "$set_line" -lt "$refusal_line" ]] ||
  { cat "$tmp/nvme.log"; fail "the refusal does not follow the translation line that set gradients_on_nvme"; }

echo "=== 4. torchrun-style variables"
"$torchrun" 2 "$train" "${flags[@]}" --save_every=0 --out="$tmp/torchrun" > "$tmp/torchrun.log" 2>&1 ||
  { cat "$tmp/torchrun.log"; fail "torchrun-style run"; }
grep -q "2 ranks (torchrun-style variables, tcp)" "$tmp/torchrun.log" || { cat "$tmp/torchrun.log"; fail "did not train as 2 ranks"; }
cmp "$tmp/ref/model.safetensors" "$tmp/torchrun/model.safetensors" || fail "torchrun-style weights differ from mpirun's"

echo "=== 5. self-describing export"
grep -q '"n_head": 4' "$tmp/ref/config.json" || fail "config.json lacks n_head"
"$evaluate" --weights="$tmp/ref/model.safetensors" --text=data/quickstart.txt --device=cpu > "$tmp/eval.log" 2>&1 ||
  { cat "$tmp/eval.log"; fail "evaluate without --heads"; }
grep -q "^loss=" "$tmp/eval.log" || fail "no loss"
"$evaluate" --weights="$tmp/ref/model.safetensors" --heads=8 --text=data/quickstart.txt --device=cpu > "$tmp/eval8.log" 2>&1 &&
  fail "evaluate took --heads=8 for a 4-head model"
grep -q "heads = 8 contradicts the 4 heads recorded" "$tmp/eval8.log" || { cat "$tmp/eval8.log"; fail "wrong refusal"; }

echo "=== 6. stopped by a signal, then --resume"
# Sends signal $2 to job $1 once the run's log $3 has step 2, and waits for
# the job: its exit code in $code.
stop_after_step_2() {
  for _ in $(seq 600); do
    grep -q "^step 2 " "$3" 2>/dev/null && break
    sleep 0.05
  done
  kill "-$2" "$1"
  wait "$1"
  code=$?
}
"$mpi" 2 "$train" "${flags[@]}" --out="$tmp/signal" > "$tmp/signal.log" 2>&1 &
stop_after_step_2 $! USR1 "$tmp/signal/train.log"
stopped=$(grep -o "stopped by signal 10 (User defined signal 1) after step [0-9]* of 24" "$tmp/signal.log" | head -1)
[[ -n "$stopped" ]] || { cat "$tmp/signal.log"; fail "SIGUSR1 did not stop the run"; }
(( code != 0 )) || fail "a stopped run exited 0"
grep -q "Exit code: *138" "$tmp/signal.log" || { cat "$tmp/signal.log"; fail "the ranks did not exit 128 + SIGUSR1"; }
step=$(echo "$stopped" | sed 's/.*after step \([0-9]*\) of.*/\1/')
step_dir="$tmp/signal/checkpoints/$(printf 'step_%08d' "$step")"
[[ -f "$step_dir/COMPLETE" && -f "$step_dir/rank_00001.shard" ]] || { ls -R "$tmp/signal"; fail "no complete checkpoint of step $step"; }
[[ ! -f "$tmp/signal/model.safetensors" ]] || fail "a stopped run exported as if it had finished"
"$mpi" 2 "$train" "${flags[@]}" --out="$tmp/signal" --resume > "$tmp/signal_resumed.log" 2>&1 ||
  { cat "$tmp/signal_resumed.log"; fail "resuming a stopped run"; }
grep -q "resumed from $step_dir at step $step" "$tmp/signal_resumed.log" || { cat "$tmp/signal_resumed.log"; fail "did not resume step $step"; }
cmp "$tmp/ref/model.safetensors" "$tmp/signal/model.safetensors" || fail "the stopped and resumed weights differ from the uninterrupted run's"
# One process, SIGTERM, no --save_every: it still saves the step it stopped after.
"$train" --steps=300 --device=cpu --out="$tmp/term" > "$tmp/term.log" 2>&1 &
stop_after_step_2 $! TERM "$tmp/term/train.log"
(( code == 143 )) || { cat "$tmp/term.log"; fail "exit code $code after SIGTERM, not 143"; }
step=$(sed -n 's/.*stopped by signal 15 (Terminated) after step \([0-9]*\) of 300.*/\1/p' "$tmp/term.log" | head -1)
[[ -n "$step" && -f "$tmp/term/checkpoints/$(printf 'step_%08d' "$step")/COMPLETE" ]] ||
  { cat "$tmp/term.log"; fail "SIGTERM left no complete checkpoint"; }
# With --keep_checkpoints=1 the checkpoint of the stop is the one kept.
"$train" --steps=300 --save_every=2 --keep_checkpoints=1 --device=cpu --out="$tmp/keep" > "$tmp/keep.log" 2>&1 &
stop_after_step_2 $! TERM "$tmp/keep/train.log"
step=$(sed -n 's/.*stopped by signal 15 (Terminated) after step \([0-9]*\) of 300.*/\1/p' "$tmp/keep.log" | head -1)
[[ -n "$step" && "$(cd "$tmp/keep/checkpoints" && echo step_*)" == "$(printf 'step_%08d' "$step")" ]] ||
  { cat "$tmp/keep.log"; ls "$tmp/keep/checkpoints"; fail "a stop with --keep_checkpoints=1 kept other checkpoints"; }
echo PASS
