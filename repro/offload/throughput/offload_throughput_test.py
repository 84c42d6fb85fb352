"""//repro:offload_throughput end to end in CI size (ci.textproto beside
this file: a 32 MiB CpuDevice, one rank), then what it wrote, checked
independently of the code that wrote it:
  - the small model trains in every mode, the large one only offloaded;
  - each model at its own micro-batch (2 and 8), halved where it does not
    fit: the small one trains at its 2 everywhere; the large one's
    offloaded modes, refused at 8 (the log says so), train at a half of
    it within the budget; a mode that never fits went down to 1;
  - tokens/s x step seconds = the tokens of a step; TFLOPS = 6Ψ + attention
    per token (within [0.9, 1.5] of 6Ψ x tokens/s); fraction_of_gemm =
    tflops / gemm_tflops; device idle in [0, 1];
  - a Chrome trace per step (warm-up and timed) of every run that fit, with
    the mode's zones (adam / cpu_adam / cpu_adam (delayed)), none for one
    that did not;
and it writes a PNG and provenance.json whose command regenerates them."""
import os
import re
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
EXPERIMENT = "repro/offload/throughput/ci.textproto"
MODES = ["stage0", "stage2", "stage2+offload", "stage2+offload+dpu"]
LISTED = {"t1": 2, "t5": 8}  # ci.textproto's micro_batches
BUDGET = 32 << 20


def refusals(log):
    """(model, mode) -> the micro-batches the log says did not fit."""
    out, key = {}, None
    for line in log.splitlines():
        header = re.match(r"^\[\d+/\d+\] (\S+) \(.*\), (\S+), micro-batch \d+$", line)
        if header:
            key = header.groups()
            out[key] = []
        refused = re.match(r"^  does not fit at micro-batch (\d+) ", line)
        if refused and key:
            out[key].append(int(refused.group(1)))
    return out


class OffloadThroughput(results_check.ResultsTest):
    def test_throughput(self):
        code, log = results_check.run(RUNNER, EXPERIMENT)
        self.assertEqual(code, 0, f"the runner on {EXPERIMENT}")
        directory = os.path.join(results_check.results_root(), results_check.experiment_name(EXPERIMENT))
        data = results_check.rows(os.path.join(directory, "data.csv"))
        refused = refusals(log)
        fit = {(r["model"], r["mode"]): r["fits"] == "yes" for r in data}
        for mode in MODES:
            self.assertTrue(fit.get(("t1", mode)), f"t1 trains under {mode}")
            self.assertEqual(fit.get(("t5", mode)), mode.startswith("stage2+offload"), f"t5 under {mode}")
        for r in data:
            key = f"{r['model']} {r['mode']}"
            listed, batch = LISTED[r["model"]], int(r["micro_batch"])
            # Halving from the listed batch: every batch above this row's
            # was refused, in order.
            halvings = []
            b = listed
            while b > batch:
                halvings.append(b)
                b //= 2
            self.assertEqual(b, batch, f"{key}: micro-batch {batch} is not {listed} halved")
            self.assertEqual(refused.get((r["model"], r["mode"])), halvings, key)
            if r["model"] == "t1":
                self.assertEqual(batch, 2, f"{key} trains at its listed micro-batch")
            if r["model"] == "t5" and r["mode"].startswith("stage2+offload"):
                self.assertLess(batch, 8, f"{key}: refused at 8")
            if r["fits"] != "yes":
                self.assertEqual(batch, 1, f"{key}: halved down to 1 before giving up")
            else:
                self.assertLessEqual(int(r["device_peak_bytes"]), BUDGET, key)
            tokens = 64 * batch  # seq x micro-batch x accumulation, one rank
            traces = os.path.join(directory, "traces", f"{r['model']}_{r['mode']}")
            if r["fits"] != "yes":
                self.assertFalse(os.path.exists(traces), f"{key}: traces for a run that did not fit")
                continue
            tps, sec, tf, gemm = (float(r[k]) for k in ("tokens_per_second", "step_seconds", "tflops", "gemm_tflops"))
            self.assertLessEqual(abs(tps * sec / tokens - 1), 0.01, f"{key}: tokens/s x seconds")
            six = 6 * int(r["params"]) * tps / 1e12
            self.assertTrue(0.9 <= tf / six <= 1.5, f"{key}: tflops {tf} vs 6 psi x tokens/s {six}")
            self.assertLessEqual(abs(float(r["fraction_of_gemm"]) - tf / gemm), 1e-3, key)
            self.assertTrue(0 <= float(r["device_idle_fraction"]) <= 1, key)
            self.assertEqual(sorted(os.listdir(traces)), [f"step_{k}.json" for k in (1, 2, 3, 4)], key)
            with open(os.path.join(traces, "step_4.json"), encoding="utf-8") as handle:
                last = handle.read()
            want = {"stage0": '"adam"', "stage2": '"adam"', "stage2+offload": '"cpu_adam"',
                    "stage2+offload+dpu": '"cpu_adam (delayed)"'}[r["mode"]]
            self.assertIn('"name": ' + want, last, key)
            self.assertIn('"forward+backward"', last, key)
            if r["mode"].startswith("stage2+offload"):
                self.assertIn('"grad D2H"', last, key)
            else:
                self.assertNotIn("cpu_adam", last, key)
        self.assert_figure_and_provenance(directory)
        self.assert_command(directory, EXPERIMENT)
        self.assertFalse(os.path.exists(os.path.join(directory, "data.partial.csv")), "a complete run's partial file")


if __name__ == "__main__":
    unittest.main()
