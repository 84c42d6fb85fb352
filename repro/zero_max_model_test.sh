#!/bin/bash
# //repro:zero_max_model in CI size (repro/testdata/zero_max_model_ci
# .textproto: MP 1 and 4, DP 64, 32 GB devices, modeled), then checks what
# it wrote independently of the code that wrote it:
#   - per MP degree and stage 0-3 one formula row, then the estimator's
#     without and with buckets;
#   - the formula rows are ZeRO §5.1's 16, 4+12/N_d, 2+14/N_d and 16/N_d bytes
#     a parameter recomputed here (floor(32e9 / K) x MP);
#   - the estimator's largest model is within 0.1% of the formula's (its
#     shards are padded to N_d; nothing else differs for model states), and
#     its bytes a parameter are the formula's K within 0.1%;
#   - counting the buckets never gives a larger model, and the largest model
#     grows with the stage and linearly with the MP degree;
#   - a PNG and provenance.json exist.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/zero_max_model_ci.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/zero_max_model_ci"
cat "$dir/data.csv"
awk -F, '
  function abs(x) { return x < 0 ? -x : x }
  NR == 1 { next }
  { mp = $1; gpus = $2; stage = $3; source = $4; psi = $5; k = $6; ++rows
    order[mp] = order[mp] " " stage ":" source
    if (gpus != mp * 64) { print "MP " mp ": " gpus " GPUs"; bad = 1 }
    want_k = stage == 0 ? 16 : stage == 1 ? 4 + 12 / 64 : stage == 2 ? 2 + 14 / 64 : 16 / 64
    best[mp, stage, source] = psi }
  source == "paper formula" {
    want = mp * int(32e9 / want_k)
    if (psi != want) { print "MP " mp " stage " stage ": formula " psi ", want " want; bad = 1 }
    formula[mp, stage] = psi; next }
  source == "estimator" {
    if (abs(psi - formula[mp, stage]) > 1e-3 * formula[mp, stage]) { print "MP " mp " stage " stage ": estimator " psi " against the formula " formula[mp, stage]; bad = 1 }
    if (abs(k - want_k) > 1e-3 * want_k) { print "MP " mp " stage " stage ": " k " bytes a parameter, want " want_k; bad = 1 } }
  END {
    for (m in order) {
      if (order[m] != " 0:paper formula 0:estimator 0:estimator with buckets 1:paper formula 1:estimator 1:estimator with buckets 2:paper formula 2:estimator 2:estimator with buckets 3:paper formula 3:estimator 3:estimator with buckets") { print "MP " m ": rows" order[m]; bad = 1 }
      for (s = 0; s < 4; ++s) {
        if (best[m, s, "estimator with buckets"] > best[m, s, "estimator"]) { print "MP " m " stage " s ": buckets gave a larger model"; bad = 1 }
        if (s > 0 && !(best[m, s, "estimator"] > best[m, s - 1, "estimator"])) { print "MP " m ": stage " s " is not larger than stage " s - 1; bad = 1 }
        r = best[m, s, "estimator"] / best[1, s, "estimator"] / m
        if (abs(r - 1) > 1e-3) { print "MP " m " stage " s ": not linear in MP (" r ")"; bad = 1 }
      }
    }
    if (rows != 24) { print rows " rows, want 24"; bad = 1 }
    exit bad
  }' "$dir/data.csv" || fail "data.csv"
[ -s "$dir/figure.png" ] || fail "no figure.png"
grep -q '"command"' "$dir/provenance.json" || fail "no provenance"
echo PASS
