"""//repro:offload_max_model end to end in CI size (ci.textproto beside this
file: a 32 MiB CpuDevice, one rank), then what it wrote, checked
independently of the code that wrote it:
  - per mode the ladder is walked in order and stops at the first refusal,
    whose reason says "does not fit"; every model that trained peaked within
    the budget;
  - stage 0's largest model has 16Ψ within the budget, the first it refuses
    trains under offload, and offload's largest is at least 4x stage 0's;
  - offload's device peak is at least 2Ψ and below 16Ψ; its pinned host peak
    is at least 14Ψ (master 4, Adam 8, gradients 2), 16Ψ with DPU (the
    delayed step's 16-bit result, kept whole);
  - summary.csv's ratio is the largest offload Ψ over stage 0's, recomputed;
  - every model that trained has its last step timed: step seconds x
    TFLOPS within [0.9, 1.5] of 6Ψ x the step's tokens, device idle in
    [0, 1], its zones (the passes within the step, the mode's optimizer
    named), and summary.csv's TFLOPS and idle fraction are its largest
    model's; one that did not train has none;
  - a Chrome trace per step of every attempt that trained, the last with
    the mode's optimizer zone, none for one that did not;
and it writes a PNG and provenance.json whose command regenerates them.
The same walk started at the estimator's answer (offload.start_at_estimate)
finds every mode's largest model again, in fewer attempts, each walk still
ending at its first refusal.
A run that fails part way (an NVMe mode whose swap directory cannot be
made) exits 1 naming the path and keeps every attempt before it in
data.partial.csv, with no data.csv; a complete run leaves no partial file.
Then bad input: a ladder that does not grow exits 2 naming the field; an
unwritable results dir exits 1."""
import os
import re
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
BUDGET = 33554432
EXPERIMENT = "repro/offload/max_model/ci.textproto"


class OffloadMaxModel(results_check.ResultsTest):
    def test_max_model(self):
        directory = self.run_experiment(RUNNER, EXPERIMENT)
        largest, refused, fits = {}, {}, set()
        walks = self.ladder_walks(results_check.rows(os.path.join(directory, "data.csv")), lambda r: r["mode"])
        for mode, (trained, refusal) in walks.items():
            if refusal is not None:
                refused[mode] = refusal["model"]
            for r in trained:
                model, psi = r["model"], int(r["params"])
                device, host = int(r["device_peak_bytes"]), int(r["host_pinned_peak_bytes"])
                self.assertLessEqual(device, BUDGET, f"{mode} {model}: device peak")
                self.assert_last_step_timed(directory, r)
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
        for mode, (trained, refusal) in walks.items():
            if refusal is not None:
                self.assertEqual([refusal[k] for k in ("step_seconds", "tflops", "device_idle_fraction")],
                                 ["", "", ""], f"{mode} {refusal['model']}: a refused attempt has no step")
                traces = os.path.join(directory, "traces", f"{refusal['model']}_{mode}")
                self.assertFalse(os.path.exists(traces), f"{mode} {refusal['model']}: traces of a refused attempt")
            best = max(trained, key=lambda r: int(r["params"]))
            self.assertEqual((summary[mode]["tflops"], summary[mode]["device_idle_fraction"]),
                             (best["tflops"], best["device_idle_fraction"]), f"{mode}: the largest model's rate")
        self.assert_figure_and_provenance(directory)
        self.assert_command(directory, EXPERIMENT)
        self.assertFalse(os.path.exists(os.path.join(directory, "data.partial.csv")), "a complete run's partial file")

    def test_a_run_cut_short_keeps_its_attempts(self):
        tmp = os.environ["TEST_TMPDIR"]
        blocker = os.path.join(tmp, "not_a_directory")
        open(blocker, "w").close()
        with open(EXPERIMENT, encoding="utf-8") as handle:
            text = handle.read().replace(
                "offload {", f'offload {{\n  modes: [STAGE0, STAGE3_NVME]\n  nvme_path: "{blocker}/swap"', 1)
        experiment = os.path.join(tmp, "cut_short.textproto")
        with open(experiment, "w", encoding="utf-8") as handle:
            handle.write(text.replace('name: "offload_max_model_ci"', 'name: "offload_max_model_cut_short"'))
        results = os.path.join(tmp, "cut_short_results")
        code, out = results_check.run(RUNNER, experiment, results_dir=results)
        self.assertEqual(code, 1, out)
        self.assertIn(f"{blocker}/swap", out)
        directory = os.path.join(results, "offload_max_model_cut_short")
        self.assertFalse(os.path.exists(os.path.join(directory, "data.csv")))
        kept = results_check.rows(os.path.join(directory, "data.partial.csv"))
        trained, refusal = self.ladder_walks(kept, lambda r: r["mode"])["stage0"]
        self.assertEqual(set(r["mode"] for r in kept), {"stage0"}, "the NVMe mode's attempt failed, unwritten")
        self.assertIsNotNone(refusal, "stage 0's whole walk, its refusal included")
        for r in trained:
            self.assert_last_step_timed(directory, r)

    def assert_last_step_timed(self, directory, r):
        """A trained attempt's last step: its rate against 6Ψ per token, its traces."""
        key = f"{r['mode']} {r['model']}"
        seconds, tflops, idle = (float(r[k]) for k in ("step_seconds", "tflops", "device_idle_fraction"))
        self.assertGreater(seconds, 0, key)
        six = 6 * int(r["params"]) * 64 / seconds / 1e12  # seq 64 x micro-batch 1 tokens a step
        self.assertTrue(0.9 <= tflops / six <= 1.5, f"{key}: tflops {tflops} vs 6 psi x tokens / s {six}")
        self.assertTrue(0 <= idle <= 1, key)
        zones = dict(part.split(" @ ")[0].rsplit(" ", 1) for part in r["breakdown"].split(", "))
        self.assertIn("forward+backward", zones, key)
        self.assertLessEqual(float(zones["forward+backward"]), seconds, key)
        traces = os.path.join(directory, "traces", f"{r['model']}_{r['mode']}")
        self.assertEqual(sorted(os.listdir(traces)), [f"step_{k}.json" for k in (1, 2, 3)], key)
        with open(os.path.join(traces, "step_3.json"), encoding="utf-8") as handle:
            last = handle.read()
        want = {"stage0": '"adam"', "stage2": '"adam"', "stage2+offload": '"cpu_adam"',
                "stage2+offload+dpu": '"cpu_adam (delayed)"'}[r["mode"]]
        self.assertIn('"name": ' + want, last, key)
        self.assertIn(want.strip('"'), zones, f"{key}: the breakdown names the mode's optimizer")

    def largest_per_mode(self, directory):
        """{mode: (largest model that trained, rows of its walk)} of a run's data.csv."""
        walks = self.ladder_walks(results_check.rows(os.path.join(directory, "data.csv")), lambda r: r["mode"])
        out = {}
        for mode, (trained, refusal) in walks.items():
            largest = max(trained, key=lambda r: int(r["params"]))["model"] if trained else None
            out[mode] = (largest, len(trained) + (refusal is not None))
        return out

    def test_start_at_estimate_finds_the_same_models_in_fewer_attempts(self):
        full = self.largest_per_mode(self.run_experiment(RUNNER, EXPERIMENT))
        with open(EXPERIMENT, encoding="utf-8") as handle:
            text = handle.read().replace("offload {", "offload {\n  start_at_estimate: true", 1)
        guided_experiment = os.path.join(os.environ["TEST_TMPDIR"], "guided.textproto")
        with open(guided_experiment, "w", encoding="utf-8") as handle:
            handle.write(text.replace('name: "offload_max_model_ci"', 'name: "offload_max_model_guided"'))
        guided = self.largest_per_mode(self.run_experiment(RUNNER, guided_experiment))
        self.assertEqual(set(guided), set(full))
        for mode in full:
            self.assertEqual(guided[mode][0], full[mode][0], f"{mode}: the largest model that trains")
            self.assertLessEqual(guided[mode][1], full[mode][1], f"{mode}: attempts")
        self.assertLess(sum(n for _, n in guided.values()), sum(n for _, n in full.values()))

    def test_bad_input(self):
        tmp = os.environ["TEST_TMPDIR"]
        with open(EXPERIMENT, encoding="utf-8") as handle:
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
        code, out = results_check.run(RUNNER, EXPERIMENT,
                                      results_dir=f"{blocker}/sub")
        self.assertEqual(code, 1)
        self.assertIn(f"--results_dir: the experiment's results {blocker}/sub/offload_max_model_ci: it or a parent "
                      "is a file, not a directory", out)


if __name__ == "__main__":
    unittest.main()
