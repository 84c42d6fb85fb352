#!/bin/bash
# //repro:infinity_partition end to end in CI size
# (repro/testdata/infinity_partition_ci.textproto: 1, 2 and 4 ranks under
# mpirun), then checks what it wrote independently of the code that wrote
# it:
#   - one measured row per (world size, partitioning), and nothing else;
#   - at each world size both partitionings gather the same bytes in the
#     same number of gathers a step (every parameter of this model divides
#     by the world size, so the bandwidth-centric padding is empty), and
#     that is twice (forward and backward) at least the model's gathered
#     weights in bf16;
#   - every rate is positive;
#   - a PNG and provenance.json naming the command exist.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/infinity_partition_ci.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/infinity_partition_ci"
cat "$dir/data.csv"
# The weights above param_persistence_threshold (1024): per layer c_attn
# 128 x 384, attn c_proj 128 x 128, c_fc 128 x 512, mlp c_proj 512 x 128;
# wte 256 x 128 and wpe 64 x 128.
weights=$(( 2 * (128 * 384 + 128 * 128 + 128 * 512 + 512 * 128) + 256 * 128 + 64 * 128 ))
awk -F, -v min_bytes=$(( 2 * 2 * weights )) '
  NR == 1 { next }
  { if ($3 != "measured") { print "a row not measured: " $0; bad = 1; next }
    key = $1 "," $2; if (key in seen) { print "twice: " key; bad = 1 }; seen[key] = 1
    if ($2 != "contiguous" && $2 != "bandwidth-centric") { print "partitioning " $2; bad = 1 }
    for (c = 5; c <= 10; ++c) if ($c <= 0) { print key ": column " c " is " $c; bad = 1 }
    if ($6 < min_bytes) { print key ": gathers " $6 " bytes a step, below forward + backward of the weights " min_bytes; bad = 1 }
    bytes[key] = $6; gathers[key] = $5; ranks[$1] = 1 }
  END {
    n = 0
    for (r in ranks) {
      n++
      c = r ",contiguous"; b = r ",bandwidth-centric"
      if (!(c in seen) || !(b in seen)) { print r " ranks: a partitioning is missing"; bad = 1; continue }
      if (bytes[c] != bytes[b]) { print r " ranks: gathered bytes differ: " bytes[c] " vs " bytes[b]; bad = 1 }
      if (gathers[c] != gathers[b]) { print r " ranks: gathers differ: " gathers[c] " vs " gathers[b]; bad = 1 }
    }
    if (n != 3) { print n " world sizes, want 3"; bad = 1 }
    exit bad
  }' "$dir/data.csv" || fail "data.csv"
[ -s "$dir/figure.png" ] || fail "no figure.png"
grep -q '"command"' "$dir/provenance.json" || fail "no provenance"
echo PASS
