"""//repro:infinity_prefetch and //repro:infinity_activation_offload end to
end in CI size (repro/testdata/infinity_{prefetch,activation_offload}_ci
.textproto), then what they wrote, checked independently of the code that
wrote it:
  - data.csv has each model without, then with the feature (the mode's name
    plus "+prefetch" / "+activation-offload"), every run trained;
  - summary.csv's ratios are data.csv's, recomputed;
  - activation offload: 5-layer models keep 3 of their 6 checkpoints on the
    device, so the device peak falls by exactly 3 and the pinned host peak
    grows by exactly 6 checkpoints of micro_batch x seq x hidden fp32
    (2 x 32 rows);
  - a PNG and provenance.json exist; no swap file is left behind."""
import glob
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
SWAP = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "swap")


class InfinityPaired(results_check.ResultsTest):
    def check(self, name, feature):
        code, _ = results_check.run(RUNNER, f"repro/testdata/{name}_ci.textproto")
        self.assertEqual(code, 0)
        directory = os.path.join(results_check.results_root(), f"{name}_ci")
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
            if name == "infinity_activation_offload":
                checkpoint = 2 * 32 * int(off["hidden"]) * 4
                self.assertEqual(int(off["device_peak_bytes"]) - int(on["device_peak_bytes"]), 3 * checkpoint, model)
                self.assertEqual(int(on["host_pinned_peak_bytes"]) - int(off["host_pinned_peak_bytes"]),
                                 6 * checkpoint, model)
        self.assert_figure_and_provenance(directory)

    def test_prefetch(self):
        self.check("infinity_prefetch", "+prefetch")

    def test_activation_offload(self):
        self.check("infinity_activation_offload", "+activation-offload")

    @classmethod
    def tearDownClass(cls):
        left = glob.glob(os.path.join(SWAP, "**", "memwall_*_rank*.swap"), recursive=True)
        if left:
            raise AssertionError(f"{len(left)} swap files left behind: {left}")


if __name__ == "__main__":
    os.makedirs(SWAP, exist_ok=True)
    os.environ["TMPDIR"] = SWAP
    unittest.main()
