"""What the paired results' tests share (infinity/prefetch,
infinity/activation_offload): the experiment in CI size, then what it
wrote, checked independently of the code that wrote it:
  - data.csv has each model without, then with the feature (the mode's name
    plus the feature's suffix), every run trained;
  - summary.csv's ratios are data.csv's, recomputed;
  - a PNG and provenance.json exist; no swap file is left behind.
The tests run with TMPDIR in the test's own directory (swap files go there)."""
import glob
import os

import results_check

SWAP = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "swap")


class PairedTest(results_check.ResultsTest):
    def check_pairs(self, runner, experiment, feature):
        """Runs `experiment` and checks its pairs; {(model, on): data row}."""
        directory = self.run_experiment(runner, experiment)
        data = results_check.rows(os.path.join(directory, "data.csv"))
        self.assertEqual(len(data), 4)
        runs = {}
        for i, r in enumerate(data):
            on = r["mode"].endswith(feature)
            self.assertEqual(r["fits"], "yes", f"{r['model']} {r['mode']} trained")
            self.assertEqual(on, i % 2 == 1, f"{r['model']} {r['mode']}: without, then with")
            if on:
                self.assertEqual(r["model"], data[i - 1]["model"], "with the feature right after without")
            runs[(r["model"], on)] = r
        summary = {r["model"]: r for r in results_check.rows(os.path.join(directory, "summary.csv"))}
        for model in {m for m, _ in runs}:
            off, on = runs[(model, False)], runs[(model, True)]
            # data.csv rounds tokens/s to 0.1, so a ratio recomputed from it
            # may differ from the summary's in the third decimal; the device
            # peaks are exact bytes.
            throughput = float(on["tokens_per_second"]) / float(off["tokens_per_second"])
            memory = int(on["device_peak_bytes"]) / int(off["device_peak_bytes"])
            self.assertAlmostEqual(float(summary[model]["throughput_ratio"]), throughput, delta=0.01)
            self.assertEqual(summary[model]["device_peak_ratio"], f"{memory:.3f}")
        self.assert_figure_and_provenance(directory)
        return runs

    @classmethod
    def tearDownClass(cls):
        left = glob.glob(os.path.join(SWAP, "**", "memwall_*_rank*.swap"), recursive=True)
        if left:
            raise AssertionError(f"{len(left)} swap files left behind: {left}")


def main():
    import unittest
    os.makedirs(SWAP, exist_ok=True)
    os.environ["TMPDIR"] = SWAP
    unittest.main()
