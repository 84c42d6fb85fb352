"""//repro:infinity_tiling end to end in CI size
(repro/infinity/tiling/ci.textproto: a 4 MiB CpuDevice, one-block
GPTs of hidden 128 to 1280, tiling factors 1, 4, 16), then what it wrote,
checked independently of the code that wrote it:
  - per factor the measured walk goes up the ladder in order and stops at
    its first refusal, whose reason says "does not fit"; every model that
    trained peaked within the budget;
  - the largest hidden size grows with the factor, strictly from 1 to 16;
  - a model that trains both untiled and at factor 16 peaks lower tiled;
  - the estimator admits exactly the largest hidden size measured, per
    factor (it sums the plans the engine allocates from);
  - summary.csv's ratios are data.csv's, recomputed; a PNG and
    provenance.json exist."""
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
BUDGET = 4194304


class InfinityTiling(results_check.ResultsTest):
    def test_tiling_raises_the_largest_hidden_size(self):
        directory = self.run_experiment(RUNNER, "repro/infinity/tiling/ci.textproto")
        largest, estimated, refused, peaks = {}, {}, set(), {}
        data = results_check.rows(os.path.join(directory, "data.csv"))
        for r in data:
            if r["source"] == "estimator":
                t, hidden = int(r["tiling"]), int(r["hidden"])
                if r["fits"] == "yes" and t not in refused:
                    estimated[t] = max(estimated.get(t, 0), hidden)
                if r["fits"] != "yes":
                    refused.add(t)
            else:
                self.assertEqual(r["source"], "measured")
        measured_rows = [r for r in data if r["source"] == "measured"]
        for t, (trained, refusal) in self.ladder_walks(measured_rows, lambda r: int(r["tiling"])).items():
            hiddens = [int(r["hidden"]) for r in trained] + ([int(refusal["hidden"])] if refusal else [])
            self.assertEqual(hiddens, sorted(set(hiddens)), f"factor {t}: the walk goes up the ladder")
            for r in trained:
                hidden = int(r["hidden"])
                self.assertLessEqual(int(r["device_peak_bytes"]), BUDGET, f"factor {t}, hidden {hidden}: device peak")
                largest[t] = max(largest.get(t, 0), hidden)
                peaks[(t, hidden)] = int(r["device_peak_bytes"])
        self.assertTrue(largest[1] <= largest[4] <= largest[16], largest)
        self.assertGreater(largest[16], largest[1], "factor 16 trains a larger hidden size than untiled")
        for (t, hidden), peak in peaks.items():
            if t == 16 and (1, hidden) in peaks:
                self.assertLess(peak, peaks[(1, hidden)], f"hidden {hidden}: tiled peak")
        self.assertEqual(estimated, largest, "the estimator admits the largest measured hidden size per factor")
        summary = results_check.rows(os.path.join(directory, "summary.csv"))
        measured = {int(r["tiling"]): r for r in summary if r["source"] == "measured"}
        for t, hidden in largest.items():
            self.assertEqual(int(measured[t]["largest_hidden"]), hidden)
            self.assertEqual(measured[t]["ratio_to_untiled"], f"{hidden / largest[1]:.3f}")
        paper = [r for r in summary if r["source"] == "paper" and r["tiling"] == "16"]
        self.assertEqual([(r["largest_hidden"], r["ratio_to_untiled"]) for r in paper], [("65536", "8.000")])
        self.assert_figure_and_provenance(directory)


if __name__ == "__main__":
    unittest.main()
