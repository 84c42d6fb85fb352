#!/bin/bash
# //repro:infinity_tiling end to end in CI size
# (repro/testdata/infinity_tiling_ci.textproto: a 4 MiB CpuDevice, one-block
# GPTs of hidden 128 to 1280, tiling factors 1, 4, 16), then checks what it
# wrote independently of the code that wrote it:
#   - per factor the measured walk goes up the ladder in order and stops at
#     its first refusal, whose reason says "does not fit"; every model that
#     trained peaked within the budget;
#   - the largest hidden size grows with the factor, strictly from 1 to 16;
#   - a model that trains both untiled and at factor 16 peaks lower tiled;
#   - the estimator admits exactly the largest hidden size measured, per
#     factor (it sums the plans the engine allocates from);
#   - summary.csv's ratios are data.csv's, recomputed; a PNG and
#     provenance.json exist.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
budget=4194304
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/infinity_tiling_ci.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/infinity_tiling_ci"
cat "$dir/data.csv" "$dir/summary.csv"
awk -F, -v budget="$budget" '
  NR == 1 { next }
  { t = $1; hidden = $4; source = $6 }
  source == "estimator" { if ($7 == "yes" && !est_refused[t] && hidden > est[t]) est[t] = hidden; if ($7 == "no") est_refused[t] = 1; next }
  source != "measured" { print "unknown source " source; bad = 1; next }
  { if (done[t]) { print "factor " t ": a row after its refusal"; bad = 1 }
    if (hidden <= last[t]) { print "factor " t ": hidden " hidden " after " last[t]; bad = 1 }
    last[t] = hidden
    if ($7 == "no") { done[t] = 1; if ($0 !~ /does not fit/) { print "factor " t " hidden " hidden ": refused without saying it does not fit"; bad = 1 }; next }
    if ($8 > budget) { print "factor " t " hidden " hidden ": device peak " $8 " over the budget"; bad = 1 }
    if (hidden > largest[t]) largest[t] = hidden
    peak[t "," hidden] = $8 }
  END {
    if (!(largest[4] >= largest[1] && largest[16] >= largest[4])) { print "largest hidden does not grow with the factor: " largest[1] ", " largest[4] ", " largest[16]; bad = 1 }
    if (largest[16] <= largest[1]) { print "factor 16 trains no larger hidden than untiled: " largest[16]; bad = 1 }
    for (key in peak) { split(key, k, ","); if (k[1] != 16 || !(("1," k[2]) in peak)) continue
      if (peak[key] >= peak["1," k[2]]) { print "hidden " k[2] ": tiled peak " peak[key] " >= untiled " peak["1," k[2]]; bad = 1 } }
    for (t in largest) if (est[t] != largest[t]) { print "factor " t ": estimator admits " est[t] ", measured " largest[t]; bad = 1 }
    for (t in largest) printf "%s,measured,%.3f\n", t, largest[t] / largest[1] > ENVIRON["TEST_TMPDIR"] "/ratios"
    exit bad
  }' "$dir/data.csv" || fail "data.csv"
while IFS=, read -r t source ratio; do
  grep -q "^$t,$source,[^,]*,[0-9]*,$ratio$" "$dir/summary.csv" || fail "summary: factor $t ratio is not $ratio"
done < "$TEST_TMPDIR/ratios"
grep -q "^16,paper,,65536,8.000$" "$dir/summary.csv" || fail "no paper point"
[ -s "$dir/figure.png" ] || fail "no figure.png"
grep -q '"command"' "$dir/provenance.json" || fail "no provenance"
echo PASS
