"""memwall.perf_model: its terms against arithmetic done here, its memory
against memwall.estimate, ZeRO-Infinity §4's efficiency formula against the
model's own compute/transfer split, and the hardware files' errors."""
import dataclasses
import json
import os
import tempfile
import unittest

import memwall
from memwall import perf_model

PAPERS = "models/configs/papers.textproto"


class PerfModelTest(unittest.TestCase):
    def setUp(self):
        self.hw = perf_model.load_hardware("v100_dgx2")
        self.model = memwall.model_config(PAPERS, "offload_10b")

    def test_compute_bound_step_is_flops_over_rate(self):
        fast = dataclasses.replace(self.hw, device_memory_gbps=1e9, pcie_gbps=1e9, intra_node_gbps=1e9,
                                   inter_node_gbps=1e9, nvme_gbps=1e9, cpu_memory_gbps=1e9)
        run = perf_model.Run(model=self.model, micro_batch=4)
        p = perf_model.predict(run, fast, with_memory=False)
        L, h, s, b = 50, 4096, 1024, 4
        psi = 12 * L * h * h + 13 * L * h + (50257 + 1024) * h + 2 * h
        matmul = 12 * L * h * h + 50257 * h   # the trainer's count: the matmuls' parameters
        flops = 4 * (2 * matmul + 4 * L * s * h) * b * s   # recompute: forward twice
        rate = 125e12 * self.hw.compute_efficiency * h / (h + self.hw.half_hidden)
        self.assertEqual(p.params, psi)
        self.assertAlmostEqual(p.step_seconds / (flops / rate), 1.0, places=3)

    def test_flops_and_zone_names_are_the_engines(self):
        # One count of a step's flops for the trainer's TFLOPS and the
        # model: models::ForwardFlopsPerToken, read through the extension.
        L, h, s = 50, 4096, 1024
        self.assertEqual(memwall.forward_flops_per_token(self.model, s), 2 * (12 * L * h * h + 50257 * h) + 4 * L * s * h)
        self.assertEqual(memwall.model_shape(self.model)["hidden"], h)
        # The phases that are zones carry the zones' names, as a measured
        # breakdown does ("forward+backward 1.234 | ...").
        p = perf_model.predict(perf_model.Run(model=self.model, micro_batch=4, offload_optimizer="cpu", stage=2),
                               self.hw, with_memory=False)
        for zone in (memwall.Zone.FORWARD_BACKWARD, memwall.Zone.CPU_ADAM):
            self.assertIn(memwall.zone_name(zone), p.phases)
        self.assertEqual(memwall.zone_name(memwall.Zone.FORWARD_BACKWARD), "forward+backward")
        self.assertEqual(len(memwall.Zone.__members__), 17)

    def test_stage2_gather_is_the_ring_volume_over_the_per_gpu_share_of_the_nics(self):
        run = perf_model.Run(model=self.model, ranks=64, stage=2, micro_batch=1)
        p = perf_model.predict(run, self.hw, with_memory=False)
        per_gpu = 100e9 / 16   # 64 ranks span 4 nodes: the node's 100 GB/s over its 16 GPUs
        one = 2 * p.params * 63 / 64 / per_gpu
        self.assertAlmostEqual(p.phases["dp_reduce"], one, delta=one * 1e-9)
        self.assertAlmostEqual(p.phases["dp_gather"], one, delta=one * 1e-9)
        stage0 = perf_model.predict(dataclasses.replace(run, stage=0), self.hw, with_memory=False)
        self.assertAlmostEqual(stage0.phases["dp_reduce"], 2 * one, delta=one * 1e-9)  # all-reduce = RS + AG

    def test_dpu_hides_the_optimizer_under_the_passes(self):
        run = perf_model.Run(model=self.model, stage=2, offload_optimizer="cpu", micro_batch=10)
        plain = perf_model.predict(run, self.hw, with_memory=False)
        dpu = perf_model.predict(dataclasses.replace(run, dpu=True), self.hw, with_memory=False)
        passes = plain.visible["forward"] + plain.visible["backward"]
        self.assertAlmostEqual(plain.step_seconds, passes + plain.visible["optimizer"])
        self.assertAlmostEqual(dpu.step_seconds, max(passes, plain.visible["optimizer"]))
        self.assertLess(dpu.step_seconds, plain.step_seconds)

    def test_memory_is_the_estimators(self):
        run = perf_model.Run(model=self.model, ranks=8, stage=3, offload_optimizer="cpu", micro_batch=2)
        got = perf_model.memory(run, self.hw)
        want = memwall.estimate("seq: 1024 micro_batch: 2 accumulation: 1 precision: BF16 "
                                "zero { stage: 3 offload_optimizer { device: CPU } }",
                                model=self.model, ranks=8, device_bytes=self.hw.device_memory_bytes)
        self.assertEqual(got, want)
        # Model parallel: the slice's model states, plus the checkpoints (split with P_a).
        mp = perf_model.Run(model=self.model, ranks=16, model_parallel=4, stage=2, micro_batch=2)
        a, b = perf_model.memory(mp, self.hw), perf_model.memory(dataclasses.replace(mp, partition_activations=True))
        self.assertEqual(a["activation_bytes_per_rank_formula"], 2 * 2 * 1024 * 4096 * 50)
        self.assertEqual(b["activation_bytes_per_rank_formula"], 2 * 2 * 1024 * 4096 * 50 // 4)

    def test_efficiency_formula(self):
        # ait·bw = peak: half the time computing.
        self.assertAlmostEqual(perf_model.no_overlap_efficiency(1000, 70, 70), 0.5)
        for ait, bw in ((1024, 12), (256, 1.6), (24 * 8192, 3)):
            compute, transfer = ait / 70e12, 1 / (bw * 1e9)
            self.assertAlmostEqual(perf_model.no_overlap_efficiency(ait, bw, 70), compute / (compute + transfer))

    def test_bad_input_is_named(self):
        with self.assertRaisesRegex(ValueError, "no_such_machine.*known: .*v100_dgx2"):
            perf_model.load_hardware("no_such_machine")
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        fields = dataclasses.asdict(self.hw)
        for change, message in (({"pcie_gbs": 1}, "unknown field.*pcie_gbs"), ({"pcie_gbps": 0}, "pcie_gbps must be > 0")):
            path = os.path.join(tmp, "hw.json")
            with open(path, "w") as f:
                json.dump(dict(fields, **change), f)
            with self.assertRaisesRegex(ValueError, message):
                perf_model.load_hardware(path)
        with self.assertRaisesRegex(ValueError, "multiple of model_parallel"):
            perf_model.predict(perf_model.Run(model=self.model, ranks=6, model_parallel=4), self.hw)
        with self.assertRaisesRegex(ValueError, "stage 3"):
            perf_model.predict(perf_model.Run(model=self.model, stage=2, offload_param="cpu"), self.hw)
        with self.assertRaisesRegex(ValueError, "checkpointing"):
            perf_model.memory(perf_model.Run(model=self.model, ranks=4, model_parallel=4, checkpointing=False))

    def test_hardware_file_holds_the_committed_calibration(self):
        path = os.path.join("results", "perf_model_calibration", "calibration.csv")
        with open(path) as f:
            rows = [line.rstrip("\n").split(",") for line in f][1:]
        fitted = {r[1]: float(r[2]) for r in rows if r[0] == "v100_dgx2" and r[1] in ("compute_efficiency",
                                                                                      "half_hidden")}
        self.assertEqual(len(fitted), 2, rows)
        self.assertAlmostEqual(self.hw.compute_efficiency, fitted["compute_efficiency"], delta=1e-3)
        self.assertAlmostEqual(self.hw.half_hidden, fitted["half_hidden"], delta=1)


if __name__ == "__main__":
    unittest.main()
