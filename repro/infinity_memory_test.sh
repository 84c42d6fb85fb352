#!/bin/bash
# //repro:infinity_memory in CI size (repro/testdata/infinity_memory_ci
# .textproto: 10B and 1T over 16 ranks, modeled), then checks what it wrote
# independently of the code that wrote it:
#   - per model one formula row, then ZeRO-3, ZeRO-Inf-CPU, ZeRO-Inf-NVMe;
#   - the formula rows are ZeRO-Infinity §3's formulas recomputed here from
#     the params, layers and hidden columns (bsz 1, seq 1024);
#   - the estimator's model states over all ranks are at least 16 bytes a
#     parameter and within 1% of it (shards padded, small parameters kept
#     whole), the same whether on the device or offloaded to the CPU;
#     ZeRO-Inf-NVMe's swap files hold at least the 14 bytes a parameter of
#     16-bit parameters, master weights and Adam's moments (its total also
#     counts the pinned swap buffers, tagged as the states they carry);
#   - offloading moves bytes off the device: ZeRO-Inf-CPU's device per rank
#     is below ZeRO-3's, its host bytes above; only ZeRO-Inf-NVMe has NVMe
#     bytes, and it holds less in host memory than ZeRO-Inf-CPU;
#   - a PNG and provenance.json exist.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/infinity_memory_ci.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/infinity_memory_ci"
cat "$dir/data.csv"
awk -F, '
  NR == 1 { next }
  { model = $1; psi = $2; nl = $3; hd = $4; placement = $5; source = $6; ++rows[model]
    order[model] = order[model] " " placement }
  source == "paper formula" {
    if ($7 != 20 * psi) { print model ": model states " $7 ", want 20 x " psi; bad = 1 }
    if ($11 != 2 * 1024 * hd * nl) { print model ": activation checkpoints " $11 ", want " 2 * 1024 * hd * nl; bad = 1 }
    if ($12 != 16 * hd * hd) { print model ": model-state working " $12 ", want " 16 * hd * hd; bad = 1 }
    next }
  { states[model, placement] = $7; device[model, placement] = $8; host[model, placement] = $9; nvme[model, placement] = $10
    if (placement != "stage3+nvme+nvme-params" && ($7 < 16 * psi || $7 > 1.01 * 16 * psi)) { print model " " placement ": model states " $7 " not within 1% above 16 x " psi; bad = 1 }
    if (placement == "stage3+nvme+nvme-params" && 16 * $10 < 14 * psi) { print model ": NVMe holds " 16 * $10 " bytes, under 14 x " psi; bad = 1 }
    if ((placement == "stage3+nvme+nvme-params") != ($10 > 0)) { print model " " placement ": NVMe bytes " $10; bad = 1 } }
  END {
    for (m in rows) {
      if (order[m] != " any stage3 stage3+offload+params stage3+nvme+nvme-params") { print m ": rows" order[m]; bad = 1 }
      cpu = "stage3+offload+params"; nv = "stage3+nvme+nvme-params"
      if (states[m, "stage3"] != states[m, cpu]) { print m ": offload changed the model states"; bad = 1 }
      if (states[m, nv] < states[m, cpu]) { print m ": NVMe model states " states[m, nv] " below the CPU placement'"'"'s"; bad = 1 }
      if (!(device[m, cpu] < device[m, "stage3"] && host[m, cpu] > host[m, "stage3"])) { print m ": CPU offload did not move bytes"; bad = 1 }
      if (!(host[m, nv] < host[m, cpu])) { print m ": NVMe holds " host[m, nv] " host bytes, CPU offload " host[m, cpu]; bad = 1 }
    }
    if (length(rows) != 2) { print "want 2 models"; bad = 1 }
    exit bad
  }' "$dir/data.csv" || fail "data.csv"
[ -s "$dir/figure.png" ] || fail "no figure.png"
grep -q '"command"' "$dir/provenance.json" || fail "no provenance"
echo PASS
