#!/bin/bash
# //repro:zero_memory end to end (the runner on its checked-in experiment,
# with mpirun for 2 and 4 ranks), then checks data.csv independently of the
# code that wrote it:
#   - 12 measured sweep points (stages 0-3 x 1, 2, 4 ranks);
#   - measured model states = the paper's formula (16Ψ, 4Ψ + 12Ψ/N,
#     2Ψ + 14Ψ/N, 16Ψ/N, recomputed here from Ψ and N) up to padding: fewer
#     than N elements of 16 bytes;
#   - the estimator's model states equal the measured ones, and its total
#     is within 10% of the measured device peak;
#   - Figure 1: 7.5B on 64 ranks at stage 1 is 31406250000 bytes;
#   - figure.png is a PNG; provenance.json has its fields.
# Then bad input: an experiment with stage 4 exits 2 naming the field; a
# worker told world size 2 but launched alone exits 1 saying so.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/experiments/zero_memory.textproto --results_dir="$out" || fail "runner exit $?"
dir="$out/zero_memory"
csv="$dir/data.csv"
cat "$csv"
[[ $(awk -F, '$1 == "sweep" && $6 == "measured"' "$csv" | wc -l) -eq 12 ]] || fail "expected 12 measured rows"

# key stage,ranks -> value for each source; then compare.
awk -F, '
  $1 == "sweep" { key = $3 "," $4; psi = $5; n = $4;
    if ($6 == "measured") { m[key] = $7; mt[key] = $8 }
    if ($6 == "estimator") { e[key] = $7; et[key] = $8 }
    if ($6 == "paper") { p[key] = $7 }
    N[key] = n; P[key] = psi; S[key] = $3 }
  END {
    bad = 0
    for (k in m) {
      s = S[k]; n = N[k]; psi = P[k]
      f = (s == 0) ? 16 * psi : (s == 1) ? 4 * psi + 12 * psi / n : (s == 2) ? 2 * psi + 14 * psi / n : 16 * psi / n
      d = m[k] - f; if (d < 0) d = -d
      if (d >= 16 * n) { print "stage/ranks " k ": measured " m[k] " vs formula " f; bad = 1 }
      if (e[k] != m[k]) { print "stage/ranks " k ": estimator model states " e[k] " vs measured " m[k]; bad = 1 }
      r = et[k] / mt[k]
      if (r < 0.9 || r > 1.1) { print "stage/ranks " k ": estimator total " et[k] " vs measured peak " mt[k]; bad = 1 }
      pd = p[k] - f; if (pd < 0) pd = -pd
      if (pd > 1) { print "stage/ranks " k ": paper row " p[k] " vs formula " f; bad = 1 }
    }
    exit bad
  }' "$csv" || fail "measured, estimated and paper bytes disagree"
grep -q '^modeled,"ZeRO Figure 1: 7.5B parameters, 64 ranks",1,64,7500000000,estimator,31406250000,' "$csv" \
  || fail "Figure 1 stage 1"

[[ "$(head -c 4 "$dir/figure.png" | od -An -tx1 | tr -d ' ')" == "89504e47" ]] || fail "figure.png is not a PNG"
for key in experiment commit date command machine cpu cores memory_gib gpu measured_or_modeled files; do
  grep -q "\"$key\"" "$dir/provenance.json" || fail "provenance.json has no $key"
done

sed 's/^stages: .*/stages: [0, 4]/' repro/experiments/zero_memory.textproto > "$TEST_TMPDIR/bad.textproto"
err=$("$run" "$TEST_TMPDIR/bad.textproto" --results_dir="$out" 2>&1); code=$?
[[ $code -eq 2 && "$err" == *"Experiment stages = 4 must be 0, 1, 2 or 3"* ]] || fail "stage 4: exit $code: $err"
err=$("$run" repro/experiments/zero_memory.textproto --worker --world_size=2 --rows_out="$TEST_TMPDIR/rows" 2>&1); code=$?
[[ $code -eq 1 && "$err" == *"world size is 2 but 1 rank was launched (run it with mpirun -np 2)"* ]] \
  || fail "world size: exit $code: $err"
echo PASS
