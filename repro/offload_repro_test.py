"""//repro:offload_max_model and //repro:offload_throughput end to end in CI
size (repro/testdata/*_ci.textproto: a 32 MiB CpuDevice, one rank), then
what they wrote, checked independently of the code that wrote it:
max model
  - per mode the ladder is walked in order and stops at the first refusal,
    whose reason says "does not fit"; every model that trained peaked within
    the budget;
  - stage 0's largest model has 16Ψ within the budget, the first it refuses
    trains under offload, and offload's largest is at least 4x stage 0's;
  - offload's device peak is at least 2Ψ and below 16Ψ; its pinned host peak
    is at least 14Ψ (master 4, Adam 8, gradients 2), 16Ψ with DPU (a second
    gradient buffer);
  - summary.csv's ratio is the largest offload Ψ over stage 0's, recomputed;
throughput
  - the small model trains in every mode, the large one only offloaded;
  - tokens/s x step seconds = the tokens of a step; TFLOPS = 6Ψ + attention
    per token (within [0.9, 1.5] of 6Ψ x tokens/s); fraction_of_gemm =
    tflops / gemm_tflops; device idle in [0, 1];
  - a Chrome trace per step (warm-up and timed) of every run that fit, with
    the mode's zones (adam / cpu_adam / cpu_adam (delayed)), none for one
    that did not;
and both write a PNG and provenance.json whose command regenerates them.
Then bad input: a ladder that does not grow exits 2 naming the field; an
unwritable results dir exits 1."""
import json
import os
import re
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
BUDGET = 33554432
MODES = ["stage0", "stage2", "stage2+offload", "stage2+offload+dpu"]


class OffloadRepro(results_check.ResultsTest):
    def assert_command(self, directory):
        with open(os.path.join(directory, "provenance.json"), encoding="utf-8") as handle:
            command = json.load(handle)["command"]
        # The command as a user would type it to regenerate these results.
        self.assertRegex(command, r"^\./bazelw run //repro:run -- repro/testdata/offload_[a-z_]*_ci\.textproto "
                                  r"--results_dir=")

    def test_max_model(self):
        directory = self.run_experiment(RUNNER, "repro/testdata/offload_max_model_ci.textproto")
        largest, refused, fits = {}, {}, set()
        walks = self.ladder_walks(results_check.rows(os.path.join(directory, "data.csv")), lambda r: r["mode"])
        for mode, (trained, refusal) in walks.items():
            if refusal is not None:
                refused[mode] = refusal["model"]
            for r in trained:
                model, psi = r["model"], int(r["params"])
                device, host = int(r["device_peak_bytes"]), int(r["host_pinned_peak_bytes"])
                self.assertLessEqual(device, BUDGET, f"{mode} {model}: device peak")
                largest[mode] = max(largest.get(mode, 0), psi)
                fits.add((mode, model))
                if "offload" in mode:
                    self.assertTrue(2 * psi <= device < 16 * psi, f"{mode} {model}: device peak {device}")
                    self.assertGreaterEqual(host, (16 if "dpu" in mode else 14) * psi, f"{mode} {model}: pinned peak")
        self.assertLessEqual(16 * largest["stage0"], BUDGET)
        self.assertIn("stage0", refused, "stage 0 refuses a model")
        self.assertIn(("stage2+offload", refused["stage0"]), fits, "offload trains what stage 0 refuses")
        self.assertIn(("stage2+offload+dpu", refused["stage0"]), fits, "DPU trains what stage 0 refuses")
        self.assertGreaterEqual(largest["stage2+offload"], 4 * largest["stage0"])
        summary = {r["mode"]: r for r in results_check.rows(os.path.join(directory, "summary.csv"))
                   if r["source"] == "measured"}
        self.assertEqual(summary["stage2+offload"]["ratio_to_stage0"],
                         f"{largest['stage2+offload'] / largest['stage0']:.3f}")
        self.assert_figure_and_provenance(directory)
        self.assert_command(directory)

    def test_throughput(self):
        directory = self.run_experiment(RUNNER, "repro/testdata/offload_throughput_ci.textproto")
        data = results_check.rows(os.path.join(directory, "data.csv"))
        fit = {(r["model"], r["mode"]): r["fits"] == "yes" for r in data}
        for mode in MODES:
            self.assertTrue(fit.get(("t1", mode)), f"t1 trains under {mode}")
            self.assertEqual(fit.get(("t5", mode)), mode.startswith("stage2+offload"), f"t5 under {mode}")
        tokens = 64 * 1 * 1  # seq x micro-batch x accumulation, one rank
        for r in data:
            key = f"{r['model']} {r['mode']}"
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
        self.assert_command(directory)

    def test_bad_input(self):
        tmp = os.environ["TEST_TMPDIR"]
        with open("repro/testdata/offload_max_model_ci.textproto", encoding="utf-8") as handle:
            text = handle.read().replace('name: "t2" layers: 8', 'name: "t2" layers: 2')
        bad = os.path.join(tmp, "bad.textproto")
        with open(bad, "w", encoding="utf-8") as handle:
            handle.write(text)
        code, out = results_check.run(RUNNER, bad)
        self.assertEqual(code, 2)
        self.assertTrue(re.search(r'offload\.ladder\[1\] \("t2"\) = .* parameters must be larger than the model '
                                  r"before it", out), out)
        blocker = os.path.join(tmp, "file")
        open(blocker, "w").close()
        code, out = results_check.run(RUNNER, "repro/testdata/offload_max_model_ci.textproto",
                                      results_dir=f"{blocker}/sub")
        self.assertEqual(code, 1)
        self.assertIn(f"cannot create {blocker}/sub/offload_max_model_ci", out)


if __name__ == "__main__":
    unittest.main()
