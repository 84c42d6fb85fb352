"""//repro:infinity_max_model end to end in CI size
(repro/infinity/max_model/ci.textproto: a 32 MiB CpuDevice with
96 MiB of pinned host memory, one rank), then what it wrote, checked
independently of the code that wrote it:
  - per mode the ladder is walked in order and stops at the first refusal,
    whose reason says "does not fit"; every model that trained peaked within
    both budgets;
  - the first model CPU offload refuses is refused for pinned host memory and
    trains under NVMe offload (its optimizer states exceed the pinned budget);
  - NVMe offload's pinned peak is below 12 bytes a parameter (the states are
    on disk), CPU offload's at least 14 (master 4, Adam 8, gradients 2);
  - NVMe's largest model is larger than CPU offload's, and summary.csv's
    ratio is that ratio, recomputed;
  - with the 16-bit parameters on the host too (+params): CPU offload's
    pinned peak is at least 16 bytes a parameter; NVMe offload trains a
    larger model than without, one whose 16-bit parameters alone exceed the
    device;
  - with the 16-bit parameters on NVMe too (+nvme-params): a model at least
    as large as with them on the host trains, and for each model both train
    its pinned peak is the host mode's less the 2-byte shard, give or take
    the parameter swap buffers (< 1 MiB here);
  - with every model state on NVMe, the gradient shard too (nvme-all): the
    first model +nvme-params refuses is refused for pinned host memory and
    trains, and for each model both train its pinned peak is +nvme-params'
    less the 2-byte gradient shard, give or take the gradient swap buffers
    (< 1 MiB here); summary.csv sets the paper's ZeRO-Inf-NVMe beside it;
  - the swap files are gone afterwards; a PNG and provenance.json exist."""
import glob
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
DEVICE, PINNED = 33554432, 100663296
SWAP = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "swap")


class InfinityMaxModel(results_check.ResultsTest):
    def test_nvme_offload_trains_larger_models(self):
        directory = self.run_experiment(RUNNER, "repro/infinity/max_model/ci.textproto")
        largest, refused, why, fits, peak, params = {}, {}, {}, set(), {}, {}
        walks = self.ladder_walks(results_check.rows(os.path.join(directory, "data.csv")), lambda r: r["mode"])
        for mode, (trained, refusal) in walks.items():
            if refusal is not None:
                refused[mode], why[mode] = refusal["model"], refusal["reason"]
            for r in trained:
                model, psi = r["model"], int(r["params"])
                device, pinned = int(r["device_peak_bytes"]), int(r["host_pinned_peak_bytes"])
                self.assertLessEqual(device, DEVICE, f"{mode} {model}: device peak")
                self.assertLessEqual(pinned, PINNED, f"{mode} {model}: pinned peak")
                largest[mode] = max(largest.get(mode, 0), psi)
                fits.add((mode, model))
                if mode == "stage3+nvme":
                    self.assertLess(pinned, 12 * psi, f"{mode} {model}")
                if mode == "stage3+offload":
                    self.assertGreaterEqual(pinned, 14 * psi, f"{mode} {model}")
                if mode == "stage3+offload+params":
                    self.assertGreaterEqual(pinned, 16 * psi, f"{mode} {model}")
                peak[(mode, model)], params[model] = pinned, psi
        self.assertIn("stage3+offload", refused, "CPU offload refuses a model")
        self.assertIn("pinned", why["stage3+offload"])
        self.assertIn(("stage3+nvme", refused["stage3+offload"]), fits, "NVMe trains what CPU offload refuses")
        self.assertGreater(largest["stage3+nvme"], largest["stage3+offload"])
        self.assertGreater(largest["stage3+nvme+params"], largest["stage3+nvme"])
        for (mode, model), pinned in peak.items():
            if mode == "stage3+nvme+nvme-params" and ("stage3+nvme+params", model) in peak:
                want = peak[("stage3+nvme+params", model)] - 2 * params[model]
                self.assertTrue(want <= pinned <= want + 1048576, f"{model}: pinned peak {pinned}, want {want}")
        self.assertGreaterEqual(largest["stage3+nvme+nvme-params"], largest["stage3+nvme+params"])
        self.assertIn("pinned", why["stage3+nvme+nvme-params"])
        self.assertIn(("stage3+nvme-all", refused["stage3+nvme+nvme-params"]), fits,
                      "every state on NVMe trains what the pinned gradient shard refuses")
        self.assertGreater(largest["stage3+nvme-all"], largest["stage3+nvme+nvme-params"])
        both = 0
        for (mode, model), pinned in peak.items():
            if mode == "stage3+nvme-all" and ("stage3+nvme+nvme-params", model) in peak:
                want = peak[("stage3+nvme+nvme-params", model)] - 2 * params[model]
                self.assertTrue(want <= pinned <= want + 1048576, f"{model}: pinned peak {pinned}, want {want}")
                both += 1
        self.assertGreater(both, 0)
        self.assertGreater(2 * largest["stage3+nvme+params"], DEVICE)
        summary = {r["mode"]: r for r in results_check.rows(os.path.join(directory, "summary.csv"))
                   if r["source"] == "measured"}
        self.assertEqual(summary["stage3+nvme"]["ratio_to_cpu_offload"],
                         f"{largest['stage3+nvme'] / largest['stage3+offload']:.3f}")
        self.assertEqual(summary["stage3+offload"]["ratio_to_cpu_offload"], "1.000")
        paper = {r["mode"]: r for r in results_check.rows(os.path.join(directory, "summary.csv"))
                 if r["source"] == "paper"}
        self.assertIn("ZeRO-Inf-NVMe", paper["stage3+nvme-all"]["largest_model"])
        left = glob.glob(os.path.join(SWAP, "**", "memwall_*_rank*.swap"), recursive=True)
        self.assertEqual(left, [], "swap files left behind")
        self.assert_figure_and_provenance(directory)


if __name__ == "__main__":
    os.makedirs(SWAP, exist_ok=True)
    os.environ["TMPDIR"] = SWAP
    unittest.main()
