#!/bin/bash
# The wheel as a user gets it: installed by pip into a fresh virtual
# environment (no PYTHONPATH, run from outside the source tree), then
# python/README.md's example, the first ```python block, run as printed:
#   1. once: it prints the estimate and 4 steps, saves step 4, exports the
#      weights with config.json and reads them back into numpy;
#   2. again in the same directory: it resumes from step 4 and saves step 8;
#   3. under mpirun as 2 ranks in a new directory: the checkpoint holds a
#      shard per rank.
# And the package is the installed one: memwall and memwall.cpu_adam import
# from the environment's site-packages, with the extension inside it.
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
wheels=(python/memwall-*.whl)
[[ ${#wheels[@]} == 1 && -f "${wheels[0]}" ]] || fail "expected one wheel, found: ${wheels[*]}"
wheel="$PWD/${wheels[0]}" readme="$PWD/python/README.md" mpi="$PWD/tools/mpi_test_runner.sh"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
unset PYTHONPATH PYTHONHOME

echo "=== install $(basename "$wheel")"
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv" || fail "cannot create a virtual environment"
python="$tmp/venv/bin/python"
"$python" -m pip install --no-index --no-cache-dir --disable-pip-version-check "$wheel" > "$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; fail "pip install"; }

cd "$tmp" || fail "cd $tmp"
"$python" - "$tmp/venv" <<'EOF' || fail "the installed package"
import os, sys
import memwall, memwall.cpu_adam, memwall.dtype
import numpy as np
site = os.path.realpath(sys.argv[1])
for module in (memwall, memwall._memwall, memwall.cpu_adam):
    assert os.path.realpath(module.__file__).startswith(site), f"{module.__name__} comes from {module.__file__}"
assert memwall._memwall.__file__.endswith(".so"), memwall._memwall.__file__
w = np.ones(8, np.float32)
memwall.cpu_adam.AdamW([w], lr=0.1, weight_decay=0.0).step([np.ones(8, np.float32)])
assert np.allclose(w, 0.9, atol=1e-6), w  # Adam's first step moves each weight by lr
assert os.path.getsize(memwall.QUICKSTART_TEXT) > 1000
print("installed at", os.path.dirname(memwall.__file__))
EOF

"$python" - "$readme" > "$tmp/example.py" <<'EOF' || fail "no python block in README.md"
import re, sys
blocks = re.findall(r"^```python\n(.*?)^```", open(sys.argv[1]).read(), re.S | re.M)
assert blocks, "no ```python block"
print(blocks[0], end="")
EOF
lines=$(grep -cv '^\s*$' "$tmp/example.py")
(( lines <= 16 )) || fail "the example has $lines lines"

echo "=== 1. the example"
mkdir -p "$tmp/one" && cd "$tmp/one" || fail "mkdir"
"$python" "$tmp/example.py" > run1.log 2>&1 || { cat run1.log; fail "the example failed"; }
cat run1.log
grep -q "device bytes per rank: [0-9]" run1.log || fail "no estimate"
grep -q "saved run/checkpoints/step_0*4$" run1.log || fail "step 4 not saved"
[[ -f run/checkpoints/step_00000004/COMPLETE ]] || fail "no complete checkpoint at step 4"
[[ -s run/model.safetensors && -s run/config.json ]] || fail "no export with config.json"
grep -q '"n_head": 4' run/config.json || fail "config.json lacks the head count"
grep -q "'wte.weight': (256, 64)" run1.log || fail "the weights were not read back into numpy"

echo "=== 2. again: it resumes"
"$python" "$tmp/example.py" > run2.log 2>&1 || { cat run2.log; fail "the second run failed"; }
grep -q "saved run/checkpoints/step_0*8$" run2.log || { cat run2.log; fail "the second run did not resume to step 8"; }

echo "=== 3. under mpirun, 2 ranks"
mkdir -p "$tmp/two" && cd "$tmp/two" || fail "mkdir"
"$mpi" 2 "$python" "$tmp/example.py" > run.log 2>&1 || { cat run.log; fail "the example under mpirun"; }
[[ $(grep -c "saved run/checkpoints/step_0*4$" run.log) == 2 ]] || { cat run.log; fail "not both ranks saved step 4"; }
shards=$(ls run/checkpoints/step_00000004 | grep -c '^rank_')
[[ "$shards" == 2 ]] || { ls run/checkpoints/step_00000004; fail "$shards shards, not 2"; }
[[ -s run/model.safetensors && -s run/config.json ]] || fail "no export under mpirun"
echo "PASS"
