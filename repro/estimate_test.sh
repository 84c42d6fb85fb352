#!/bin/bash
# //repro:estimate end to end: the JSON carries the keys the issue names and
# the paper's numbers (ZeRO Figure 1: 7.5B, 64 ranks, stage 1 = 4Ψ + 12Ψ/N);
# a model from the papers' list gets activations counted; a budget too small
# exits 1 and says so; ZeRO-Offload's device and host bytes (offload_optimizer
# { device: CPU }, with and without DPU); the settings are the trainer's
# TrainingConfig, from --config and --set; bad input exits 2 naming the flag
# or the config field.
set -uo pipefail
bin=repro/estimate
fail() { echo "FAIL: $*"; exit 1; }

json=$($bin --params=7500000000 --ranks=64 --set='zero { stage: 1 }' --format=json) || fail "exit $?"
echo "$json"
for key in model_states_bytes_per_rank total_device_bytes_per_rank host_bytes_per_rank fits; do
  [[ "$json" == *"\"$key\": "* ]] || fail "no $key"
done
[[ "$json" == *'"model_states_bytes_per_rank": 31406250000'* ]] || fail "stage 1 model states"
[[ "$json" == *'"fits": null'* ]] || fail "no budget must give no verdict"
[[ "$json" == *'"assumed": {"seq": 128, "micro_batch": 1, "accumulation": 1, "precision": "bf16", "checkpointing": false, "stage": 1}'* ]] \
  || fail "the JSON does not say what it assumed"
text=$($bin --params=7.5e9 --ranks=64 --set='zero { stage: 1 }') || fail "--params=7.5e9: exit $?"
[[ "$text" == *"parameters: 7500000000"* ]] || fail "7.5e9 is not 7500000000: $text"
[[ "$text" == *"assumed: seq 128, micro-batch 1, accumulation 1, bf16, stage 1"* ]] || fail "no assumptions: $text"
[[ "$text" == *"no budget given"* && "$text" != *"fits in"* && "$text" != *"DOES NOT FIT"* ]] || fail "a verdict without a budget: $text"
err=$($bin --params=1.5 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--params=1.5 is not a whole number"* ]] || fail "--params=1.5: $err"
# Micro-batch 32: bf16 activations and checkpoints of 10B's 50 layers, with
# its 2 psi of parameters, exceed 32 GiB (micro-batch 16 would fit).
text=$($bin --model=offload_10b --ranks=1 --set='zero { stage: 2 offload_optimizer { device: CPU } } micro_batch: 32 seq: 1024' \
  --device_bytes=34359738368); code=$?
[[ $code -eq 1 && "$text" == *"assumed: seq 1024, micro-batch 32, accumulation 1, bf16, activation checkpointing on, stage 2, optimizer states on CPU"* ]] \
  || fail "offload_10b by name at seq 1024: exit $code: $text"
[[ "$text" == *"would fit:"*"--set='zero { stage: 3 offload_optimizer { device: CPU } offload_param { device: CPU } }'  device "* ]] \
  || fail "DOES NOT FIT suggests no placement: $text"

text=$($bin --model=models/configs/papers.textproto --model_name=offload_10b --ranks=1 \
  --set='zero { stage: 2 } micro_batch: 10 seq: 1024' --device_bytes=34359738368)
code=$?
echo "$text"
[[ $code -eq 1 ]] || fail "a 10B model with activations does not fit one 32 GiB device at stage 2 (exit $code)"
[[ "$text" == *"DOES NOT FIT in 32.00 GiB"* ]] || fail "no verdict"
[[ "$text" == *"activations"* ]] || fail "activations not counted"

# ZeRO-Offload, 10B parameters on one rank: the device keeps 2Ψ; the host
# 4Ψ + 8Ψ + 2Ψ plus staging: one 64 MiB reduce bucket, two 4 Mi-element
# tiles of bf16 values, the 8-byte norm pair (engine/estimate.h); with DPU
# the delayed step's 2Ψ of values (its gradients share the one shard), on
# the device with delayed_values_on_device.
json=$($bin --params=10000000000 --ranks=1 --set='zero { stage: 2 offload_optimizer { device: CPU } }' --format=json) || fail "offload: exit $?"
echo "$json"
[[ "$json" == *'"model_states_bytes_per_rank": 20000000000,'* ]] || fail "offload device model states != 2 psi"
host=$((14 * 10000000000 + 64 * 1048576 + 2 * 2 * 4194304 + 8))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "offload host bytes != $host"
json=$($bin --params=10000000000 --ranks=4 \
  --set='zero { stage: 1 offload_optimizer { device: CPU delayed_update_after_steps: 40 } }' --format=json) \
  || fail "dpu: exit $?"
shard=2500000000
host=$((14 * shard + 64 * 1048576 + 2 * 2 * 4194304 + 8 + 2 * shard))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "stage 1 + offload + DPU on 4 ranks: host bytes != $host"
json=$($bin --params=10000000000 --ranks=4 --set='zero { stage: 1 offload_optimizer { device: CPU
  delayed_update_after_steps: 40 delayed_values_on_device: true } }' --format=json) || fail "dpu on the device: exit $?"
host=$((14 * shard + 64 * 1048576 + 2 * 2 * 4194304 + 8))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "DPU, its values on the device: host bytes != $host"
[[ "$json" == *"\"staging\": $((2 * shard)),"* ]] || fail "DPU, its values on the device: no 2 psi of device staging"
[[ "$json" == *'"grads": 0,'* ]] || fail "stage 1 + offload keeps device gradients"

err=$($bin --params=100 --set='zero { stage: 2 offload_optimizer { device: GPU } }' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *'Unknown enumeration value of "GPU" for field "device"'* ]] || fail "offload GPU: exit $code: $err"
err=$($bin --params=100 --set='zero { stage: 2 offload_optimizer { delayed_update_after_steps: 40 } }' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"zero.offload_optimizer.delayed_update_after_steps = 40 needs offload_optimizer.device = CPU"* ]] \
  || fail "dpu without offload: $err"
err=$($bin --params=100 --set='zero { stage: 0 offload_optimizer { device: CPU } }' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"offload_optimizer.device = CPU with stage = 0"* ]] || fail "offload at stage 0: $err"
err=$($bin --params=100 --set='zero { stage: 4 }' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"TrainingConfig zero.stage = 4"* ]] || fail "stage 4: exit $code: $err"
err=$($bin --params=100 --set='micro_batch: 0' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"TrainingConfig micro_batch = 0 must be > 0"* ]] || fail "micro_batch 0: exit $code: $err"
err=$($bin --params=100 --set='stage: 2' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *'--set: '*'has no field named "stage"'* ]] || fail "stage outside zero: exit $code: $err"
err=$($bin --params=100 --config=no/such.textproto 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--config "*"no/such.textproto does not exist"* ]] || fail "missing config: $err"

# A config file (relative to where the tool was started), --set over it:
# the same estimate as the flags alone.
cfg=$(mktemp -d)/stage3.textproto
printf 'precision: FP16\nzero { stage: 3 }\n' > "$cfg"
from_file=$($bin --params=7500000000 --ranks=64 --config="$cfg" --set='precision: BF16' --format=json) || fail "config: exit $?"
inline=$($bin --params=7500000000 --ranks=64 --set='zero { stage: 3 }' --format=json) || fail "inline: exit $?"
[[ "$from_file" == "$inline" ]] || fail "--config + --set differs from --set alone: $from_file vs $inline"
[[ "$inline" == *'"model_states_bytes_per_rank": 1875000000'* ]] || fail "stage 3 model states != 16 psi / 64"
err=$($bin --params=100 --model=x.textproto 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"exactly one of --params"* ]] || fail "both sizes: $err"
err=$($bin --model=models/configs/papers.textproto 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"pick one with --model_name"* ]] || fail "list without a name: $err"
err=$($bin --params=100 --checkpointing=maybe 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"--checkpointing=maybe"* ]] || fail "checkpointing: $err"
# NVMe offload (ZeRO-Infinity): the pinned optimizer states are three swap
# buffers of 3 x 4 x tile (4 Mi elements) bytes, not 12 bytes a parameter.
json=$($bin --params=10000000000 --ranks=1 \
  --set='zero { stage: 2 offload_optimizer { device: NVME nvme_path: "/nvme" } }' --format=json) || fail "nvme: exit $?"
echo "$json"
host=$((3 * 3 * 4 * 4194304 + 2 * 10000000000 + 64 * 1048576 + 2 * 2 * 4194304 + 8))
[[ "$json" == *"\"host_bytes_per_rank\": $host,"* ]] || fail "NVMe offload host bytes != $host"
groups=$(( (10000000000 + 4194303) / 4194304 ))
nvme=$(( groups * 3 * 4194304 * 4 ))   # the swap file: master, exp_avg, exp_avg_sq per sub-group
[[ "$json" == *"\"nvme_bytes_per_rank\": $nvme,"* ]] || fail "NVMe offload swap file bytes != $nvme"
# The verdict for each budget, at the byte: exit 1 and "DOES NOT FIT" for
# the one a byte short, exit 0 when all three hold.
nvme_set='zero { stage: 2 offload_optimizer { device: NVME nvme_path: "/nvme" } }'
out=$($bin --params=10000000000 --set="$nvme_set" --host_bytes=$host --disk_bytes=$nvme) \
  || fail "exact host and disk budgets: exit $?"
[[ "$out" == *"fits in"*"of pinned host memory"* && "$out" == *"fits in"*"of disk (NVMe swap files)"* ]] || fail "verdicts: $out"
out=$($bin --params=10000000000 --set="$nvme_set" --host_bytes=$((host - 1)) --disk_bytes=$nvme); code=$?
[[ $code -eq 1 && "$out" == *"DOES NOT FIT in"*"of pinned host memory"* && "$out" == *"fits in"*"of disk (NVMe swap files)"* ]] \
  || fail "host a byte short: exit $code: $out"
json=$($bin --params=10000000000 --set="$nvme_set" --host_bytes=$host --disk_bytes=$((nvme - 1)) --format=json); code=$?
[[ $code -eq 1 && "$json" == *"\"fits\": false"* && "$json" == *"\"fits_host\": true"* && "$json" == *"\"fits_disk\": false"* ]] \
  || fail "disk a byte short: exit $code: $json"
# CPU offload of the same model needs 12 bytes a parameter more pinned memory.
out=$($bin --params=10000000000 --set='zero { stage: 2 offload_optimizer { device: CPU } }' --host_bytes=$host); code=$?
[[ $code -eq 1 && "$out" == *"DOES NOT FIT in"*"of pinned host memory"* ]] || fail "CPU offload under NVMe's host budget: exit $code: $out"
# Stage 3 with the 16-bit parameters on NVMe too (offload_param NVME): the
# swap file gains the 2-byte shard (block-aligned), and pinned memory holds
# 6 swap buffers of one tile (4 Mi elements, 8 MiB) plus a block each
# instead of the shard it holds with the parameters on the CPU.
s3='zero { stage: 3 offload_optimizer { device: NVME nvme_path: "/nvme" } offload_param { device: '
json_cpu=$($bin --params=10000000000 --set="${s3}CPU } }" --format=json) || fail "stage 3 CPU params: exit $?"
json_nvme=$($bin --params=10000000000 --set="${s3}NVME nvme_path: \"/nvme\" } }" --format=json) \
  || fail "stage 3 NVMe params: exit $?"
field() { sed -n "s/.*\"$1\": \([0-9]*\),.*/\1/p" <<<"$2"; }
[[ $(( $(field nvme_bytes_per_rank "$json_nvme") - $(field nvme_bytes_per_rank "$json_cpu") )) -eq $(( (20000000000 + 4095) / 4096 * 4096 )) ]] \
  || fail "NVMe parameters: the swap files do not gain the 2-byte shard: $json_nvme"
[[ $(( $(field host_bytes_per_rank "$json_cpu") - $(field host_bytes_per_rank "$json_nvme") )) -eq $(( 20000000000 - 6 * (8388608 + 4096) )) ]] \
  || fail "NVMe parameters: pinned memory does not lose the shard for 6 swap buffers: $json_cpu $json_nvme"
err=$($bin --params=100 --set='zero { stage: 3 offload_param { device: NVME nvme_path: "/p" } }' 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"offload_param.device = NVME needs offload_optimizer.device = CPU or NVME"* ]] \
  || fail "NVMe parameters without an offloaded optimizer: $err"
err=$($bin --params=100 --disk_bytes=-1 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"disk_bytes = -1 must be >= 0"* ]] || fail "negative disk budget: $err"
# --buffers lists the plan buffer by buffer: stage 3's modules kept for
# reuse are max_reuse_distance elements of bf16, a transient peak; the
# listed device bytes add up to the total.
text=$($bin --model=gpt_125m --set='zero { stage: 3 max_reuse_distance: 1000000 }' --buffers) || fail "--buffers: exit $?"
echo "$text"
grep -q '^  parameters: gather: modules kept for reuse  *device  *comm_buffers  *2000000  .*(peak of transient buffers)$' <<<"$text" \
  || fail "no kept modules of 1e6 bf16 elements in --buffers"
listed=$(awk '/^every buffer/ {on = 1; next}
              on { for (i = 1; i <= NF; ++i) if ($i == "device") { sum += $(i + 2); break } }
              END { printf "%.0f", sum }' <<<"$text")
total=$($bin --model=gpt_125m --set='zero { stage: 3 max_reuse_distance: 1000000 }' --format=json | sed -n 's/.*"total_device_bytes_per_rank": \([0-9]*\),.*/\1/p')
[[ -n "$listed" && "$listed" -eq "$total" ]] || fail "--buffers' device bytes $listed != the total $total"
echo PASS
