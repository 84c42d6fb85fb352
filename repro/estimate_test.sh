#!/bin/bash
# //repro:estimate end to end: the JSON carries the keys the issue names and
# the paper's numbers (ZeRO Figure 1: 7.5B, 64 ranks, stage 1 = 4Ψ + 12Ψ/N);
# a model from the papers' list gets activations counted; a budget too small
# exits 1 and says so; ZeRO-Offload's device and host bytes (--offload=cpu,
# with and without DPU); bad input exits 2 naming the flag.
set -uo pipefail
bin=repro/estimate
fail() { echo "FAIL: $*"; exit 1; }

json=$($bin --params=7500000000 --ranks=64 --stage=1 --format=json) || fail "exit $?"
echo "$json"
for key in model_states_bytes_per_rank total_device_bytes_per_rank host_bytes_per_rank fits; do
  [[ "$json" == *"\"$key\": "* ]] || fail "no $key"
done
[[ "$json" == *'"model_states_bytes_per_rank": 31406250000'* ]] || fail "stage 1 model states"
[[ "$json" == *'"fits": true'* ]] || fail "no budget means it fits"

text=$($bin --model=models/configs/papers.textproto --model_name=offload_10b --ranks=1 --stage=2 \
  --micro_batch=10 --seq=1024 --device_bytes=34359738368)
code=$?
echo "$text"
[[ $code -eq 1 ]] || fail "a 10B model with activations does not fit one 32 GiB device at stage 2 (exit $code)"
[[ "$text" == *"DOES NOT FIT in 32.00 GiB"* ]] || fail "no verdict"
[[ "$text" == *"activations"* ]] || fail "activations not counted"

# ZeRO-Offload, 10B parameters on one rank: the device keeps 2Ψ; the host
# 4Ψ + 8Ψ + 2Ψ plus staging: one 64 MiB reduce bucket, two 4 Mi-element
# tiles of bf16 values, the 8-byte norm pair (zero/estimator.h); with DPU a
# second 2Ψ of gradients and the delayed step's 2Ψ of values.
json=$($bin --params=10000000000 --ranks=1 --stage=2 --offload=cpu --format=json) || fail "offload: exit $?"
echo "$json"
[[ "$json" == *'"model_states_bytes_per_rank": 20000000000,'* ]] || fail "offload device model states != 2 psi"
host=$((14 * 10000000000 + 64 * 1048576 + 2 * 2 * 4194304 + 8))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "offload host bytes != $host"
json=$($bin --params=10000000000 --ranks=4 --stage=1 --offload=cpu --delayed_update_after_steps=40 --format=json) \
  || fail "dpu: exit $?"
shard=2500000000
host=$((16 * shard + 64 * 1048576 + 2 * 2 * 4194304 + 8 + 2 * shard))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "stage 1 + offload + DPU on 4 ranks: host bytes != $host"
[[ "$json" == *'"grads": 0,'* ]] || fail "stage 1 + offload keeps device gradients"

err=$($bin --params=100 --stage=2 --offload=gpu 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--offload=gpu is not none or cpu"* ]] || fail "offload=gpu: exit $code: $err"
err=$($bin --params=100 --stage=2 --delayed_update_after_steps=40 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--delayed_update_after_steps needs --offload=cpu"* ]] || fail "dpu without offload: $err"
err=$($bin --params=100 --stage=3 --offload=cpu 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"offload_optimizer.device = CPU with stage = 3"* ]] || fail "offload at stage 3: $err"
err=$($bin --params=100 --stage=4 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"ZeroConfig stage = 4"* ]] || fail "stage 4: exit $code: $err"
err=$($bin --params=100 --model=x.textproto 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"exactly one of --params"* ]] || fail "both sizes: $err"
err=$($bin --model=models/configs/papers.textproto 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"pick one with --model_name"* ]] || fail "list without a name: $err"
err=$($bin --params=100 --checkpointing=maybe 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--checkpointing=maybe"* ]] || fail "checkpointing: $err"
echo PASS
