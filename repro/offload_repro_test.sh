#!/bin/bash
# //repro:offload_max_model and //repro:offload_throughput end to end in CI
# size (repro/testdata/*_ci.textproto: a 32 MiB CpuDevice, one rank), then
# checks what they wrote independently of the code that wrote it:
# max model
#   - per mode the ladder is walked in order and stops at the first refusal,
#     whose reason says "does not fit"; every model that trained peaked
#     within the budget;
#   - stage 0's largest model has 16Ψ within the budget, the first it refuses
#     trains under offload, and offload's largest is at least 4x stage 0's;
#   - offload's device peak is at least 2Ψ and below 16Ψ; its pinned host
#     peak is at least 14Ψ (master 4, Adam 8, gradients 2), 16Ψ with DPU
#     (a second gradient buffer);
#   - summary.csv's ratio is the largest offload Ψ over stage 0's, recomputed;
# throughput
#   - the small model trains in every mode, the large one only offloaded;
#   - tokens/s x step seconds = the tokens of a step; TFLOPS = 6Ψ + attention
#     per token (within [0.9, 1.5] of 6Ψ x tokens/s); fraction_of_gemm =
#     tflops / gemm_tflops; device idle in [0, 1];
#   - a Chrome trace per step (warm-up and timed) of every run that fit,
#     with the mode's zones (adam / cpu_adam / cpu_adam (delayed)), none for
#     one that did not;
# and both write a PNG and provenance.json. Then bad input: a ladder that
# does not grow exits 2 naming the field; an unwritable results dir exits 1.
set -uo pipefail
run="$1"
out="$TEST_TMPDIR/results"
budget=33554432
fail() { echo "FAIL: $*"; exit 1; }

"$run" repro/testdata/offload_max_model_ci.textproto --results_dir="$out" || fail "max model: runner exit $?"
dir="$out/offload_max_model_ci"
cat "$dir/data.csv" "$dir/summary.csv"
awk -F, -v budget="$budget" '
  NR == 1 { next }
  { mode = $5; psi = $2
    if (done[mode]) { print mode ": a row after its refusal"; bad = 1 }
    if ($6 == "no") { done[mode] = 1; if ($0 !~ /does not fit/) { print mode " " $1 ": refused without saying it does not fit"; bad = 1 }
                      refused[mode] = $1; next }
    if ($8 > budget) { print mode " " $1 ": device peak " $8 " over the budget"; bad = 1 }
    if (psi > largest[mode]) { largest[mode] = psi; name[mode] = $1 }
    fits[mode "," $1] = 1
    if (mode ~ /offload/) {
      if ($8 < 2 * psi || $8 >= 16 * psi) { print mode " " $1 ": device peak " $8 " not in [2, 16) x " psi; bad = 1 }
      host = (mode ~ /dpu/) ? 16 : 14
      if ($9 < host * psi) { print mode " " $1 ": pinned host peak " $9 " < " host " x " psi; bad = 1 }
    } }
  END {
    if (16 * largest["stage0"] > budget) { print "stage 0 trained a model whose states exceed the budget"; bad = 1 }
    if (!("stage0" in refused)) { print "stage 0 refused nothing"; bad = 1 }
    if (!fits["stage2+offload," refused["stage0"]]) { print "offload does not train " refused["stage0"] ", which stage 0 refuses"; bad = 1 }
    if (!fits["stage2+offload+dpu," refused["stage0"]]) { print "DPU does not train " refused["stage0"]; bad = 1 }
    if (largest["stage2+offload"] < 4 * largest["stage0"]) { print "offload largest " largest["stage2+offload"] " < 4 x stage 0 " largest["stage0"]; bad = 1 }
    printf "%.3f\n", largest["stage2+offload"] / largest["stage0"] > ENVIRON["TEST_TMPDIR"] "/ratio"
    exit bad
  }' "$dir/data.csv" || fail "max model data.csv"
ratio=$(cat "$TEST_TMPDIR/ratio")
grep -q "^stage2+offload,[^,]*,[0-9]*,$ratio,measured$" "$dir/summary.csv" || fail "summary ratio is not $ratio"

"$run" repro/testdata/offload_throughput_ci.textproto --results_dir="$out" || fail "throughput: runner exit $?"
tdir="$out/offload_throughput_ci"
cat "$tdir/data.csv"
# The CSV has a quoted breakdown column with commas: read it with Python's csv.
/usr/bin/python3 - "$tdir" <<'PY' || fail "throughput data.csv / traces"
import csv, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "data.csv"))))
bad = []
fit = {(r["model"], r["mode"]): r["fits"] == "yes" for r in rows}
modes = ["stage0", "stage2", "stage2+offload", "stage2+offload+dpu"]
for m in modes:
    if not fit.get(("t1", m)): bad.append("t1 does not train under " + m)
    want = m.startswith("stage2+offload")
    if fit.get(("t5", m)) != want: bad.append("t5 under %s: fits=%s" % (m, fit.get(("t5", m))))
tokens = 64 * 1 * 1  # seq x micro-batch x accumulation, one rank
for r in rows:
    key = "%s %s" % (r["model"], r["mode"])
    tdir = os.path.join(d, "traces", r["model"] + "_" + r["mode"])
    if r["fits"] != "yes":
        if os.path.exists(tdir): bad.append(key + ": traces for a run that did not fit")
        continue
    tps, sec, tf, gemm = (float(r[k]) for k in ("tokens_per_second", "step_seconds", "tflops", "gemm_tflops"))
    if abs(tps * sec / tokens - 1) > 0.01: bad.append("%s: tokens/s x seconds = %g, not %d" % (key, tps * sec, tokens))
    six = 6 * int(r["params"]) * tps / 1e12
    if not 0.9 <= tf / six <= 1.5: bad.append("%s: tflops %g vs 6 psi x tokens/s %g" % (key, tf, six))
    if abs(float(r["fraction_of_gemm"]) - tf / gemm) > 1e-3: bad.append(key + ": fraction_of_gemm")
    if not 0 <= float(r["device_idle_fraction"]) <= 1: bad.append(key + ": idle fraction")
    steps = sorted(os.listdir(tdir))
    if steps != ["step_%d.json" % k for k in (1, 2, 3, 4)]: bad.append("%s: traces %s" % (key, steps))
    last = open(os.path.join(tdir, "step_4.json")).read()
    want = {"stage0": '"adam"', "stage2": '"adam"', "stage2+offload": '"cpu_adam"',
            "stage2+offload+dpu": '"cpu_adam (delayed)"'}[r["mode"]]
    if '"name": ' + want not in last: bad.append("%s: step 4 trace has no %s zone" % (key, want))
    if '"forward+backward"' not in last: bad.append(key + ": no forward+backward zone")
    if r["mode"].startswith("stage2+offload") and '"grad D2H"' not in last: bad.append(key + ": no grad D2H")
    if not r["mode"].startswith("stage2+offload") and "cpu_adam" in last: bad.append(key + ": cpu_adam without offload")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY

for d in "$dir" "$tdir"; do
  [[ "$(head -c 4 "$d/figure.png" | od -An -tx1 | tr -d ' ')" == "89504e47" ]] || fail "$d/figure.png is not a PNG"
  for key in experiment commit date command machine measured_or_modeled files; do
    grep -q "\"$key\"" "$d/provenance.json" || fail "$d/provenance.json has no $key"
  done
  # The command as a user would type it to regenerate these results.
  grep -q '"command": "./bazelw run //repro:run -- repro/testdata/offload_[a-z_]*_ci.textproto --results_dir=' \
    "$d/provenance.json" || fail "$d/provenance.json: $(grep '"command"' "$d/provenance.json")"
done

sed 's/name: "t2" layers: 8/name: "t2" layers: 2/' repro/testdata/offload_max_model_ci.textproto > "$TEST_TMPDIR/bad.textproto"
err=$("$run" "$TEST_TMPDIR/bad.textproto" --results_dir="$out" 2>&1); code=$?
[[ $code -eq 2 && "$err" == *'offload.ladder[1] ("t2") = '*' parameters must be larger than the model before it'* ]] \
  || fail "shrinking ladder: exit $code: $err"
touch "$TEST_TMPDIR/file"
err=$("$run" repro/testdata/offload_max_model_ci.textproto --results_dir="$TEST_TMPDIR/file/sub" 2>&1); code=$?
[[ $code -eq 1 && "$err" == *"cannot create $TEST_TMPDIR/file/sub/offload_max_model_ci"* ]] \
  || fail "unwritable results dir: exit $code: $err"
echo PASS
