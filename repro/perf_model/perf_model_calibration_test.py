"""The box's NVMe rate from a max-model walk (nvme_gbps_of): perf_model's
12 bytes a parameter (read in while as many are written) over the optimizer
zone of the largest model that trained, the swap waits inside that zone;
smaller models, refused ones and rows without the zone do not count, and no
such row gives None. And the experiments behind the dev VM's held-out
steps: each measured mode maps to a Run, prefetch as the experiment ran
it."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_model_calibration as calibration  # noqa: E402
from memwall import perf_model  # noqa: E402


def row(params, fits="yes", breakdown=""):
    return {"params": str(params), "fits": fits, "breakdown": breakdown}


class NvmeRate(unittest.TestCase):
    def test_the_largest_trained_models_optimizer_zone(self):
        rows = [row(10**8, breakdown="cpu_adam 1.0, forward+backward 0.5"),
                row(10**9, breakdown="cpu_adam 6.0, forward+backward 3.0, swap wait 5.5, "
                                     "swap-in 5.0 @ 2.40 GB/s, swap-out 4.5 @ 2.67 GB/s"),
                row(2 * 10**9, fits="no")]
        # 12 bytes x 1e9 parameters each way in 6 s.
        self.assertAlmostEqual(calibration.nvme_gbps_of(rows), 2.0)

    def test_no_optimizer_zone_no_rate(self):
        self.assertIsNone(calibration.nvme_gbps_of([]))
        self.assertIsNone(calibration.nvme_gbps_of([row(10**9, breakdown="adam 0.2, forward+backward 1.0")]))
        self.assertIsNone(calibration.nvme_gbps_of([row(10**9, fits="no", breakdown="cpu_adam 1.0")]))



EXPERIMENT = """name: "{name}"
kind: {kind}
training {{ seq: 64 micro_batch: 2 }}
offload {{
  ladder {{ name: "m1" layers: 2 hidden: 64 heads: 2 vocab: 128 positions: 64 activation_checkpointing: true }}
}}
"""


class HeldOutRows(unittest.TestCase):
    def workspace(self, kind, modes):
        """A workspace with one experiment of `kind` under repro/ and its
        results/<name>/data.csv, one trained row of m1 per mode."""
        ws = tempfile.mkdtemp()
        os.makedirs(os.path.join(ws, "repro", "x"))
        os.makedirs(os.path.join(ws, "results", "probe"))
        with open(os.path.join(ws, "repro", "x", "experiment.textproto"), "w") as f:
            f.write(EXPERIMENT.format(name="probe", kind=kind))
        params = perf_model._params('name: "m1" layers: 2 hidden: 64 heads: 2 vocab: 128 positions: 64 '
                                    'activation_checkpointing: true')
        with open(os.path.join(ws, "results", "probe", "data.csv"), "w") as f:
            f.write("model,params,mode,fits,step_seconds,breakdown\n")
            for mode in modes:
                f.write(f'm1,{params},{mode},yes,1.0,"forward+backward 0.5, cpu_adam 0.2"\n')
        return ws

    def test_every_mode_of_the_held_out_walks_is_a_run(self):
        modes = ["stage3", "stage3+offload", "stage3+nvme", "stage3+offload+params", "stage3+nvme+params",
                 "stage3+nvme+nvme-params", "stage3+nvme-all"]
        rows = calibration.measured_rows(self.workspace("INFINITY_MAX_MODEL", modes), [("probe", "probe")], "held-out")
        runs = {r["mode"]: r["run"] for r in rows}
        self.assertEqual(sorted(runs), sorted(modes))
        for mode, run in runs.items():
            self.assertEqual(run.stage, 3, mode)
            self.assertTrue(run.prefetch, mode)   # the max-model walk prefetches
            self.assertEqual((run.seq, run.micro_batch), (64, 2), mode)
        self.assertEqual((runs["stage3"].offload_optimizer, runs["stage3"].offload_param), ("none", "none"))
        self.assertEqual((runs["stage3+nvme+params"].offload_optimizer, runs["stage3+nvme+params"].offload_param),
                         ("nvme", "cpu"))
        self.assertTrue(runs["stage3+nvme-all"].gradients_on_nvme)
        self.assertFalse(runs["stage3+nvme+nvme-params"].gradients_on_nvme)
        for r in rows:   # every such Run predicts
            perf_model.predict(r["run"], perf_model.load_hardware("v100_dgx2"), with_memory=False)

    def test_the_prefetch_walk_runs_its_plain_modes_without_prefetch(self):
        modes = ["stage3+nvme+nvme-params", "stage3+nvme+nvme-params+prefetch"]
        rows = calibration.measured_rows(self.workspace("INFINITY_PREFETCH", modes), [("probe", "probe")], "held-out")
        self.assertEqual({r["mode"]: r["run"].prefetch for r in rows},
                         {"stage3+nvme+nvme-params": False, "stage3+nvme+nvme-params+prefetch": True})

    def test_a_mode_without_a_run_is_named(self):
        ws = self.workspace("INFINITY_MAX_MODEL", ["stage9+teleport"])
        with self.assertRaisesRegex(ValueError, "probe: mode 'stage9\\+teleport' has no Run"):
            calibration.measured_rows(ws, [("probe", "probe")], "held-out")


if __name__ == "__main__":
    unittest.main()
