#!/bin/bash
# //repro:infinity_prefetch and //repro:infinity_activation_offload end to
# end in CI size (repro/testdata/infinity_{prefetch,activation_offload}_ci
# .textproto), then checks what they wrote independently of the code that
# wrote it:
#   - data.csv has each model without, then with the feature (the mode's
#     name plus "+prefetch" / "+activation-offload"), every run trained;
#   - summary.csv's ratios are data.csv's, recomputed;
#   - activation offload: 5-layer models keep 3 of their 6 checkpoints on
#     the device, so the device peak falls by exactly 3 and the pinned host
#     peak grows by exactly 6 checkpoints of micro_batch x seq x hidden
#     fp32 (2 x 32 rows);
#   - a PNG and provenance.json exist; no swap file is left behind.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
export TMPDIR="$TEST_TMPDIR/swap"
mkdir -p "$TMPDIR"
fail() { echo "FAIL: $*"; exit 1; }

for name in infinity_prefetch infinity_activation_offload; do
  "$run" "repro/testdata/${name}_ci.textproto" --results_dir="$out" || fail "$name: runner exit $?"
  dir="$out/${name}_ci"
  cat "$dir/data.csv" "$dir/summary.csv"
  feature=$([ "$name" = infinity_prefetch ] && echo "+prefetch" || echo "+activation-offload")
  awk -F, -v feature="$feature" -v name="$name" '
    NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    { model = $col["model"]; mode = $col["mode"]; on = substr(mode, length(mode) - length(feature) + 1) == feature
      if ($col["fits"] != "yes") { print model " " mode ": did not train"; bad = 1 }
      if (on != (n % 2 == 1)) { print model " " mode ": out of order (without, then with)"; bad = 1 }
      if (on && model != last) { print model ": with the feature but not without"; bad = 1 }
      last = model; ++n
      tps[model, on] = $col["tokens_per_second"]; dev[model, on] = $col["device_peak_bytes"]; pin[model, on] = $col["host_pinned_peak_bytes"]
      hidden[model] = $col["hidden"]; models[model] = 1 }
    END {
      for (m in models) {
        printf "%s,%.3f,%.3f\n", m, tps[m, 1] / tps[m, 0], dev[m, 1] / dev[m, 0] > ENVIRON["TEST_TMPDIR"] "/ratios_" name
        if (name == "infinity_activation_offload") {
          checkpoint = 2 * 32 * hidden[m] * 4
          if (dev[m, 0] - dev[m, 1] != 3 * checkpoint) { print m ": device peak fell by " dev[m, 0] - dev[m, 1] ", want " 3 * checkpoint; bad = 1 }
          if (pin[m, 1] - pin[m, 0] != 6 * checkpoint) { print m ": pinned peak grew by " pin[m, 1] - pin[m, 0] ", want " 6 * checkpoint; bad = 1 }
        }
      }
      if (n != 4) { print "want 4 rows, have " n; bad = 1 }
      exit bad
    }' "$dir/data.csv" || fail "$name: data.csv"
  # data.csv rounds tokens/s to 0.1, so a ratio recomputed from it may
  # differ from the summary's (computed before rounding) in the third
  # decimal; the device peaks are exact bytes.
  while IFS=, read -r model throughput memory; do
    awk -F, -v m="$model" -v t="$throughput" -v mem="$memory" '
      $1 == m { found = 1; d = $6 - t; if (d < 0) d = -d
                if (d > 0.01 || $9 != mem) { print "summary for " m ": " $6 ", " $9 "; data.csv gives " t ", " mem; exit 1 } }
      END { if (!found) { print "no summary for " m; exit 1 } }' "$dir/summary.csv" || fail "$name: summary.csv"
  done < "$TEST_TMPDIR/ratios_$name"
  [ -s "$dir/figure.png" ] || fail "$name: no figure.png"
  grep -q '"command"' "$dir/provenance.json" || fail "$name: no provenance"
done
left=$(find "$TMPDIR" -name 'memwall_*_rank*.swap' | wc -l)
[ "$left" -eq 0 ] || fail "$left swap files left behind"
echo PASS
