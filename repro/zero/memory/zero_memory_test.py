"""//repro:zero_memory end to end (the runner on its checked-in experiment,
with mpirun for 2 and 4 ranks), then data.csv checked independently of the
code that wrote it:
  - 12 measured sweep points (stages 0-3 x 1, 2, 4 ranks);
  - measured model states = the paper's formula (16Ψ, 4Ψ + 12Ψ/N,
    2Ψ + 14Ψ/N, 16Ψ/N, recomputed here from Ψ and N) up to padding: fewer
    than N elements of 16 bytes;
  - the estimator's model states equal the measured ones, and its total is
    within 10% of the measured device peak;
  - Figure 1: 7.5B on 64 ranks at stage 1 is 31406250000 bytes;
  - figure.png is a PNG; provenance.json has its fields.
Then bad input: an experiment with stage 4 exits 2 naming the field; a
worker told world size 2 but launched alone exits 1 saying so."""
import os
import re
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
EXPERIMENT = "repro/zero/memory/experiment.textproto"


def formula(stage, psi, n):
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]


class ZeroMemory(results_check.ResultsTest):
    def test_measured_estimated_and_paper_bytes_agree(self):
        directory = self.run_experiment(RUNNER, EXPERIMENT)
        data = results_check.rows(os.path.join(directory, "data.csv"))
        sweep = {}
        for r in data:
            if r["part"] == "sweep":
                sweep.setdefault((int(r["stage"]), int(r["ranks"])), {})[r["source"]] = r
        measured = [key for key, by in sweep.items() if "measured" in by]
        self.assertEqual(len(measured), 12)
        for (stage, n), by in sweep.items():
            m, e, p = by["measured"], by["estimator"], by["paper"]
            psi = int(m["params"])
            f = formula(stage, psi, n)
            where = f"stage {stage}, {n} ranks"
            self.assertLess(abs(int(m["model_states_bytes_per_rank"]) - f), 16 * n, f"{where}: measured vs formula {f}")
            self.assertEqual(e["model_states_bytes_per_rank"], m["model_states_bytes_per_rank"], f"{where}: estimator vs measured")
            ratio = int(e["total_device_bytes_per_rank"]) / int(m["total_device_bytes_per_rank"])
            self.assertTrue(0.9 <= ratio <= 1.1, f"{where}: estimator total over measured peak {ratio}")
            self.assertLessEqual(abs(float(p["model_states_bytes_per_rank"]) - f), 1, f"{where}: paper row vs formula")
        figure1 = [r for r in data if r["part"] == "modeled" and r["source"] == "estimator" and r["stage"] == "1"
                   and r["label"] == "ZeRO Figure 1: 7.5B parameters, 64 ranks"]
        self.assertEqual(len(figure1), 1)
        self.assertEqual(figure1[0]["ranks"], "64")
        self.assertEqual(figure1[0]["params"], "7500000000")
        self.assertEqual(figure1[0]["model_states_bytes_per_rank"], "31406250000")
        self.assert_figure_and_provenance(directory)

    def test_bad_input(self):
        bad = os.path.join(os.environ["TEST_TMPDIR"], "bad.textproto")
        with open(EXPERIMENT, encoding="utf-8") as handle:
            text = re.sub(r"(?m)^stages: .*$", "stages: [0, 4]", handle.read())
        with open(bad, "w", encoding="utf-8") as handle:
            handle.write(text)
        code, out = results_check.run(RUNNER, bad)
        self.assertEqual(code, 2)
        self.assertIn("Experiment stages = 4 must be 0, 1, 2 or 3", out)
        rows_out = os.path.join(os.environ["TEST_TMPDIR"], "rows")
        code, out = results_check.run(RUNNER, EXPERIMENT, "--worker", "--world_size=2", f"--rows_out={rows_out}")
        self.assertEqual(code, 1)
        self.assertIn("world size is 2 but 1 rank was launched (run it with mpirun -np 2)", out)


if __name__ == "__main__":
    unittest.main()
