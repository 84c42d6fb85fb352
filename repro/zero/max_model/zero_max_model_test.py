"""//repro:zero_max_model in CI size (ci.textproto beside this file: MP 1
and 4, DP 64, 32 GB devices, modeled), then what it wrote, checked independently of the code that wrote it:
  - per MP degree and stage 0-3 one formula row, then the estimator's
    without and with buckets;
  - the formula rows are ZeRO §5.1's 16, 4+12/N_d, 2+14/N_d and 16/N_d bytes
    a parameter recomputed here (floor(32e9 / K) x MP);
  - the estimator's largest model is within 0.1% of the formula's (its shards
    are padded to N_d; nothing else differs for model states), and its bytes
    a parameter are the formula's K within 0.1%;
  - counting the buckets never gives a larger model, and the largest model
    grows with the stage and linearly with the MP degree;
  - a PNG and provenance.json exist."""
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
SOURCES = ["paper formula", "estimator", "estimator with buckets"]


def bytes_per_parameter(stage, n=64):
    return {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]


class ZeroMaxModel(results_check.ResultsTest):
    def test_experiments_run_by_name_and_an_unknown_name_lists_them(self):
        code, out = results_check.run(RUNNER, "zero_max_model_ci")
        self.assertEqual(code, 0, out)
        self.assertTrue(os.path.exists(os.path.join(results_check.results_root(), "zero_max_model_ci", "data.csv")))
        code, out = results_check.run(RUNNER, "zero_max_modle")
        self.assertEqual(code, 2, out)
        self.assertIn("no experiment file or name 'zero_max_modle'; the experiments are: ", out)
        self.assertIn("zero_max_model_ci", out)
        self.assertIn("offload_throughput", out)

    def test_the_estimator_gives_table_2(self):
        directory = self.run_experiment(RUNNER, "repro/zero/max_model/ci.textproto")
        data = results_check.rows(os.path.join(directory, "data.csv"))
        self.assertEqual(len(data), 24)
        best, order = {}, {}
        for r in data:
            mp, stage, source, psi = int(r["model_parallel"]), int(r["stage"]), r["source"], int(r["max_params"])
            order.setdefault(mp, []).append((stage, source))
            self.assertEqual(int(r["gpus"]), mp * 64)
            k = bytes_per_parameter(stage)
            best[(mp, stage, source)] = psi
            where = f"MP {mp} stage {stage}"
            if source == "paper formula":
                self.assertEqual(psi, mp * int(32e9 / k), where)
            elif source == "estimator":
                formula = best[(mp, stage, "paper formula")]
                self.assertLessEqual(abs(psi - formula), 1e-3 * formula, where)
                self.assertLessEqual(abs(float(r["bytes_per_param"]) - k), 1e-3 * k, where)
        for mp, rows in order.items():
            self.assertEqual(rows, [(s, source) for s in range(4) for source in SOURCES], f"MP {mp}")
            for s in range(4):
                self.assertLessEqual(best[(mp, s, "estimator with buckets")], best[(mp, s, "estimator")])
                if s > 0:
                    self.assertGreater(best[(mp, s, "estimator")], best[(mp, s - 1, "estimator")])
                ratio = best[(mp, s, "estimator")] / best[(1, s, "estimator")] / mp
                self.assertLessEqual(abs(ratio - 1), 1e-3, f"MP {mp} stage {s}: linear in MP")
        self.assert_figure_and_provenance(directory)


if __name__ == "__main__":
    unittest.main()
