#!/bin/bash
# //repro:infinity_max_model end to end in CI size
# (repro/testdata/infinity_max_model_ci.textproto: a 32 MiB CpuDevice with
# 96 MiB of pinned host memory, one rank), then checks what it wrote
# independently of the code that wrote it:
#   - per mode the ladder is walked in order and stops at the first refusal,
#     whose reason says "does not fit"; every model that trained peaked
#     within both budgets;
#   - the first model CPU offload refuses is refused for pinned host memory
#     and trains under NVMe offload (its optimizer states exceed the pinned
#     budget);
#   - NVMe offload's pinned peak is below 12 bytes a parameter (the states
#     are on disk), CPU offload's at least 14 (master 4, Adam 8, gradients 2);
#   - NVMe's largest model is larger than CPU offload's, and summary.csv's
#     ratio is that ratio, recomputed;
#   - with the 16-bit parameters on the host too (+params): CPU offload's
#     pinned peak is at least 16 bytes a parameter; NVMe offload trains a
#     larger model than without, one whose 16-bit parameters alone exceed
#     the device;
#   - with the 16-bit parameters on NVMe too (+nvme-params): a model at
#     least as large as with them on the host trains, and for each model
#     both train its pinned peak is the host mode's less the 2-byte shard,
#     give or take the parameter swap buffers (< 1 MiB here);
#   - the swap files are gone afterwards; a PNG and provenance.json exist.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
export TMPDIR="$TEST_TMPDIR/swap"  # where the NVMe mode's swap files go
mkdir -p "$TMPDIR"
device=33554432
pinned=100663296
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/infinity_max_model_ci.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/infinity_max_model_ci"
cat "$dir/data.csv" "$dir/summary.csv"
awk -F, -v device="$device" -v pinned="$pinned" '
  NR == 1 { next }
  { mode = $5; psi = $2
    if (done[mode]) { print mode ": a row after its refusal"; bad = 1 }
    if ($6 == "no") { done[mode] = 1; if ($0 !~ /does not fit/) { print mode " " $1 ": refused without saying it does not fit"; bad = 1 }
                      refused[mode] = $1; why[mode] = $0; next }
    if ($8 > device) { print mode " " $1 ": device peak " $8 " over the budget"; bad = 1 }
    if ($9 > pinned) { print mode " " $1 ": pinned peak " $9 " over the budget"; bad = 1 }
    if (psi > largest[mode]) largest[mode] = psi
    fits[mode "," $1] = 1
    if (mode == "stage3+nvme" && $9 >= 12 * psi) { print mode " " $1 ": pinned peak " $9 " >= 12 x " psi; bad = 1 }
    if (mode == "stage3+offload" && $9 < 14 * psi) { print mode " " $1 ": pinned peak " $9 " < 14 x " psi; bad = 1 }
    if (mode == "stage3+offload+params" && $9 < 16 * psi) { print mode " " $1 ": pinned peak " $9 " < 16 x " psi; bad = 1 }
    pinned_peak[mode "," $1] = $9; params[$1] = psi }
  END {
    if (!("stage3+offload" in refused)) { print "CPU offload refused nothing"; bad = 1 }
    if (why["stage3+offload"] !~ /pinned/) { print "CPU offload was not refused for pinned memory: " why["stage3+offload"]; bad = 1 }
    if (!fits["stage3+nvme," refused["stage3+offload"]]) { print "NVMe offload does not train " refused["stage3+offload"] ", which CPU offload refuses"; bad = 1 }
    if (largest["stage3+nvme"] <= largest["stage3+offload"]) { print "NVMe largest " largest["stage3+nvme"] " <= CPU offload largest " largest["stage3+offload"]; bad = 1 }
    if (largest["stage3+nvme+params"] <= largest["stage3+nvme"]) { print "NVMe with the parameters on the host trains no larger model: " largest["stage3+nvme+params"]; bad = 1 }
    for (key in pinned_peak) {
      split(key, k, ","); if (k[1] != "stage3+nvme+nvme-params" || !(("stage3+nvme+params," k[2]) in pinned_peak)) continue
      host = pinned_peak["stage3+nvme+params," k[2]]; want = host - 2 * params[k[2]]
      if (pinned_peak[key] < want || pinned_peak[key] > want + 1048576) { print key ": pinned peak " pinned_peak[key] ", the host mode has " host; bad = 1 }
    }
    if (largest["stage3+nvme+nvme-params"] < largest["stage3+nvme+params"]) { print "NVMe parameters train a smaller model than host parameters: " largest["stage3+nvme+nvme-params"]; bad = 1 }
    if (2 * largest["stage3+nvme+params"] <= device) { print "the largest +params model has 16-bit parameters within the device: " largest["stage3+nvme+params"]; bad = 1 }
    printf "%.3f\n", largest["stage3+nvme"] / largest["stage3+offload"] > ENVIRON["TEST_TMPDIR"] "/ratio"
    exit bad
  }' "$dir/data.csv" || fail "data.csv"
ratio=$(cat "$TEST_TMPDIR/ratio")
grep -q "^stage3+nvme,[^,]*,[0-9]*,$ratio,[^,]*,measured$" "$dir/summary.csv" || fail "summary ratio is not $ratio"
grep -q "^stage3+offload,[^,]*,[0-9]*,1.000,[^,]*,measured$" "$dir/summary.csv" || fail "CPU offload's ratio to itself is not 1"
left=$(find "$TMPDIR" -name 'memwall_*_rank*.swap' | wc -l)
[ "$left" -eq 0 ] || fail "$left swap files left behind"
[ -s "$dir/figure.png" ] || fail "no figure.png"
grep -q '"command"' "$dir/provenance.json" || fail "no provenance"
echo PASS
