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
        # The CPU Adam paces the tile pipeline's copy up; with the delayed
        # update the Adam runs under the passes and the copy up after them.
        run = perf_model.Run(model=self.model, stage=2, offload_optimizer="cpu", micro_batch=10)
        plain = perf_model.predict(run, self.hw, with_memory=False)
        dpu = perf_model.predict(dataclasses.replace(run, dpu=True), self.hw, with_memory=False)
        passes = plain.visible["forward"] + plain.visible["backward"]
        adam, up = plain.phases["cpu_adam"], plain.phases["params_up"]
        self.assertAlmostEqual(up, 2 * plain.params / 12e9)
        self.assertAlmostEqual(plain.step_seconds, passes + max(adam, up))
        self.assertAlmostEqual(dpu.step_seconds, max(passes, adam) + up)
        self.assertLess(dpu.step_seconds, plain.step_seconds)
        # With the result on the device each tile goes up as the delayed
        # Adam makes it, under the passes too.
        on_device = perf_model.predict(dataclasses.replace(run, dpu=True, dpu_values_on_device=True), self.hw,
                                       with_memory=False)
        self.assertAlmostEqual(on_device.step_seconds, max(passes, adam, up))

    def test_the_optimizer_swap_reads_and_writes_at_once(self):
        # 12 bytes of states a parameter in, 12 back out, each direction
        # at its own rate: the slower one sets the swap's time.
        run = perf_model.Run(model=self.model, stage=3, offload_optimizer="nvme", micro_batch=4)
        both = dataclasses.replace(self.hw, nvme_gbps=0.5)
        p = perf_model.predict(run, both, with_memory=False)
        per_rank = 0.5e9   # one rank: the drive is its own
        self.assertAlmostEqual(p.phases["nvme_optimizer"], 12 * p.params / per_rank, delta=1e-9 * p.params)
        slow_writes = perf_model.predict(run, dataclasses.replace(both, nvme_write_gbps=0.25), with_memory=False)
        self.assertAlmostEqual(slow_writes.phases["nvme_optimizer"], 12 * p.params / 0.25e9, delta=1e-9 * p.params)
        fast_writes = perf_model.predict(run, dataclasses.replace(both, nvme_write_gbps=4), with_memory=False)
        self.assertAlmostEqual(fast_writes.phases["nvme_optimizer"], p.phases["nvme_optimizer"])
        # The swap runs under the CPU Adam (the tile pipeline): the slower
        # of the two is the update's time.
        self.assertGreater(p.phases["nvme_optimizer"], p.phases["cpu_adam"])
        self.assertAlmostEqual(p.visible["optimizer"], max(p.phases["nvme_optimizer"], p.phases["params_up"]))
        # On the CpuDevice too: the drive's DMA takes no core, so the swap
        # hides the CPU Adam where everything else adds.
        shared = perf_model.predict(run, dataclasses.replace(both, shares_cores=True), with_memory=False)
        self.assertAlmostEqual(shared.step_seconds, sum(shared.phases.values()) - shared.phases["cpu_adam"])
        cpu = perf_model.predict(dataclasses.replace(run, offload_optimizer="cpu"),
                                 dataclasses.replace(both, shares_cores=True), with_memory=False)
        self.assertAlmostEqual(cpu.step_seconds, sum(cpu.phases.values()))

    def test_gradients_on_nvme_cost_the_drive_two_bytes_a_parameter_each_way(self):
        # One micro-batch writes the 16-bit shard under the backward pass;
        # the optimizer reads it back beside the states' 12 bytes (while 12
        # go out). A slow drive makes the backward's writes the backward's
        # bound.
        slow = dataclasses.replace(self.hw, nvme_gbps=0.5)
        run = perf_model.Run(model=self.model, stage=3, offload_optimizer="nvme", offload_param="nvme", micro_batch=4)
        host = perf_model.predict(run, slow, with_memory=False)
        disk = perf_model.predict(dataclasses.replace(run, gradients_on_nvme=True), slow, with_memory=False)
        per_rank = 0.5e9   # one rank: the drive is its own
        shard = disk.params
        self.assertAlmostEqual(disk.phases["grads_nvme"], 2 * shard / per_rank, delta=1e-9 * shard)
        self.assertAlmostEqual(disk.phases["nvme_optimizer"], 14 * shard / per_rank, delta=1e-9 * shard)
        self.assertEqual(host.phases["grads_nvme"], 0.0)
        self.assertGreaterEqual(disk.visible["backward"], disk.phases["grads_nvme"])
        self.assertGreater(disk.step_seconds, host.step_seconds)
        # Each further micro-batch reads the shard and writes it again, the
        # reads beside the writes: two micro-batches write it twice.
        two = perf_model.predict(dataclasses.replace(run, gradients_on_nvme=True, accumulation=2), slow,
                                 with_memory=False)
        self.assertAlmostEqual(two.phases["grads_nvme"], 2 * disk.phases["grads_nvme"], delta=1e-9 * shard)
        slow_reads = perf_model.predict(dataclasses.replace(run, gradients_on_nvme=True, accumulation=2),
                                        dataclasses.replace(slow, nvme_write_gbps=4), with_memory=False)
        self.assertAlmostEqual(slow_reads.phases["grads_nvme"], disk.phases["grads_nvme"], delta=1e-9 * shard)
        with self.assertRaisesRegex(ValueError, "gradients_on_nvme needs offload_optimizer nvme"):
            perf_model.predict(dataclasses.replace(run, offload_optimizer="cpu", gradients_on_nvme=True), slow,
                               with_memory=False)

    def test_stage3_fetches_the_rank_s_parameters_for_every_pass(self):
        # Each pass (forward, recompute, backward) of each micro-batch
        # fetches the rank's 2P/N bytes of 16-bit parameters into the
        # gather buffer: a copy in device memory (read and written) where
        # they live on the device, a transfer over PCIe where offloaded.
        run = perf_model.Run(model=self.model, ranks=8, stage=3, micro_batch=1, accumulation=2)
        passes = 2 * 3   # two micro-batches of forward, recompute and backward
        shard16 = 2 * perf_model._params(self.model) / 8
        on_device = perf_model.predict(run, self.hw, with_memory=False)
        self.assertAlmostEqual(on_device.phases["param_fetch"], passes * 2 * shard16 / (self.hw.device_memory_gbps * 1e9))
        on_host = perf_model.predict(dataclasses.replace(run, offload_optimizer="cpu", offload_param="cpu"), self.hw,
                                     with_memory=False)
        self.assertAlmostEqual(on_host.phases["param_fetch"], passes * shard16 / (self.hw.pcie_gbps * 1e9))
        stage2 = perf_model.predict(dataclasses.replace(run, stage=2), self.hw, with_memory=False)
        self.assertEqual(stage2.phases["param_fetch"], 0.0)
        # Under the pass it feeds (prefetch): a fetch longer than the pass
        # is the pass's time.
        slow = dataclasses.replace(self.hw, device_memory_gbps=1e-3)
        starved = perf_model.predict(run, slow, with_memory=False)
        fetch = starved.phases["param_fetch"]
        self.assertAlmostEqual(starved.visible["forward"], fetch / 3)
        self.assertAlmostEqual(starved.visible["backward"], 2 * fetch / 3)

    def test_host_passes_run_where_the_traces_put_them(self):
        # The traces of an H100 (commit 0aaa5c3's results/offload_dpu_gpu/
        # traces/): the gradients' accumulation into the host buffer runs
        # under the backward pass, the norm after it and before the update,
        # with or without the delayed update. With it, the delayed Adam and
        # the next accumulation share the host (60787c5's run.log: the 1B's
        # delayed Adam zone 0.44 s where undelayed it took 0.26 s beside a
        # 0.15-0.19 s accumulation).
        hw = dataclasses.replace(self.hw, grad_accumulate_bytes_per_param=16, grad_norm_bytes_per_param=8)
        run = perf_model.Run(model=self.model, stage=2, offload_optimizer="cpu", micro_batch=10)
        bare = perf_model.predict(run, self.hw, with_memory=False)
        plain = perf_model.predict(run, hw, with_memory=False)
        dpu = perf_model.predict(dataclasses.replace(run, dpu=True), hw, with_memory=False)
        cpu = self.hw.cpu_memory_gbps * 1e9  # the node's, one rank
        accumulate = plain.phases["grad accumulate"]
        self.assertAlmostEqual(accumulate, 16 * plain.params / cpu)
        self.assertAlmostEqual(plain.phases["grad norm"], 8 * plain.params / cpu)
        # A bucket at a time under the backward pass: the slower of the two
        # stages plus one bucket (2 bytes a gradient) of the faster.
        self.assertLess(accumulate, bare.visible["backward"])
        bucket = memwall.DEFAULT_REDUCE_BUCKET_BYTES / 2 / plain.params
        self.assertAlmostEqual(plain.visible["backward"], bare.visible["backward"] + accumulate * bucket)
        big = perf_model.predict(dataclasses.replace(run, reduce_bucket_bytes=plain.params), hw, with_memory=False)
        self.assertAlmostEqual(big.visible["backward"], bare.visible["backward"] + accumulate / 2)  # half the shard
        self.assertAlmostEqual(plain.step_seconds,
                               bare.step_seconds + accumulate * bucket + plain.phases["grad norm"])
        passes = plain.visible["forward"] + plain.visible["backward"]
        self.assertAlmostEqual(dpu.step_seconds,
                               max(passes, plain.phases["cpu_adam"] + plain.phases["grad accumulate"])
                               + plain.phases["grad norm"] + plain.phases["params_up"])
        # Where the host is the bottleneck (micro-batch 1), the delayed Adam
        # and the accumulation add up.
        one = perf_model.predict(dataclasses.replace(run, micro_batch=1), hw, with_memory=False)
        one_dpu = perf_model.predict(dataclasses.replace(run, micro_batch=1, dpu=True), hw, with_memory=False)
        host = one.phases["cpu_adam"] + one.phases["grad accumulate"]
        self.assertGreater(host, one.visible["forward"] + one.visible["backward"])
        self.assertAlmostEqual(one_dpu.step_seconds, host + one.phases["grad norm"] + one.phases["params_up"])
        # The CpuDevice overlaps nothing that takes a core: without NVMe
        # every phase adds.
        shared = dataclasses.replace(hw, shares_cores=True)
        p = perf_model.predict(run, shared, with_memory=False)
        self.assertAlmostEqual(p.step_seconds, sum(p.phases.values()))

    def test_calibrate_device_recovers_the_machine_its_steps_came_from(self):
        # Steps predicted on a known machine, their phases as the trainer's
        # zones, fitted back: the machine's rates come back.
        truth = dataclasses.replace(perf_model.load_hardware("h100_box"), compute_efficiency=0.3, half_hidden=1500,
                                    device_memory_gbps=2000, cpu_memory_gbps=120, pcie_gbps=45,
                                    grad_accumulate_bytes_per_param=17, grad_norm_bytes_per_param=9)
        rows = []
        for name in ("offload_1b", "offload_4b", "offload_10b"):
            model = memwall.model_config(PAPERS, name)
            for mode in (dict(), dict(offload_optimizer="cpu", stage=2), dict(offload_optimizer="cpu", stage=2, dpu=True)):
                run = perf_model.Run(model=model, micro_batch=4, seq=1024, **mode)
                ph = perf_model.predict(run, truth, with_memory=False).phases
                zones = {"forward+backward": ph["forward+backward"]}
                if mode:
                    zones.update({"cpu_adam": ph["cpu_adam"], "grad accumulate": ph["grad accumulate"],
                                  "grad norm": ph["grad norm"], "grad D2H": ph["grads_down"],
                                  "param H2D": ph["params_up"]})
                else:
                    zones["adam"] = ph["adam_device"]
                rows.append(dict(run=run, zones=zones, delayed=mode.get("dpu", False)))
        start = perf_model.load_hardware("h100_box")
        got = perf_model.calibrate_device(rows, start, "fitted")
        for field in perf_model.DEVICE_FITTED_FIELDS:
            self.assertAlmostEqual(getattr(got, field) / getattr(truth, field), 1.0, places=6, msg=field)
        self.assertFalse(got.shares_cores)
        self.assertEqual(got.device_tflops, start.device_tflops)
        # One hidden size cannot tell h0 from the rate: the start's h0 stays.
        one = [r for r in rows if memwall.model_shape(r["run"].model)["hidden"] == 4096]
        self.assertEqual(perf_model.calibrate_device(one, start, "one").half_hidden, start.half_hidden)
        with self.assertRaisesRegex(ValueError, "no row measures the CPU Adam"):
            perf_model.calibrate_device([r for r in rows if "adam" in r["zones"]], start, "x")

    def test_memory_is_the_estimators(self):
        run = perf_model.Run(model=self.model, ranks=8, stage=3, offload_optimizer="cpu", micro_batch=2)
        got = perf_model.memory(run, self.hw)
        want = memwall.estimate("seq: 1024 micro_batch: 2 accumulation: 1 precision: BF16 "
                                "zero { stage: 3 offload_optimizer { device: CPU } }",
                                model=self.model, ranks=8, device_bytes=self.hw.device_memory_bytes)
        self.assertEqual(got, want)
        # The delayed update's host memory: its 16-bit result, 2 bytes a
        # parameter of the shard more (its gradients share the one shard);
        # the reduce bucket as the run sets it.
        dpu = dataclasses.replace(run, stage=2, dpu=True, reduce_bucket_bytes=1 << 20)
        want = memwall.estimate("seq: 1024 micro_batch: 2 accumulation: 1 precision: BF16 zero { stage: 2 "
                                "reduce_bucket_bytes: 1048576 offload_optimizer { device: CPU "
                                "delayed_update_after_steps: 1 } }",
                                model=self.model, ranks=8, device_bytes=self.hw.device_memory_bytes)
        self.assertEqual(perf_model.memory(dpu, self.hw), want)
        plain = perf_model.memory(dataclasses.replace(dpu, dpu=False), self.hw)
        shard = -(-perf_model._params(self.model) // 8)
        self.assertAlmostEqual((want["host_bytes_per_rank"] - plain["host_bytes_per_rank"]) / shard, 2, delta=0.01)
        # With the result on the device, those 2 bytes move there.
        on_device = perf_model.memory(dataclasses.replace(dpu, dpu_values_on_device=True), self.hw)
        self.assertEqual(on_device["host_bytes_per_rank"], plain["host_bytes_per_rank"])
        self.assertAlmostEqual((on_device["total_device_bytes_per_rank"] - want["total_device_bytes_per_rank"]) / shard,
                               2, delta=0.01)
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
        for change, message in (({"pcie_gbps": "12"}, "pcie_gbps must be a number, got '12'"),
                                ({"gpus_per_node": 1.5}, "gpus_per_node must be an integer"),
                                ({"shares_cores": 1}, "shares_cores must be a bool")):
            with open(path, "w") as f:
                json.dump(dict(fields, **change), f)
            with self.assertRaisesRegex(ValueError, f"hardware file {path}: {message}"):
                perf_model.load_hardware(path)
        with open(path, "w") as f:
            json.dump([fields], f)
        with self.assertRaisesRegex(ValueError, "not a JSON object"):
            perf_model.load_hardware(path)
        # A Hardware made in code is checked as a file's is.
        for change, message in (({"pcie_gbps": float("nan")}, "pcie_gbps must be a finite number"),
                                ({"half_hidden": float("inf")}, "half_hidden must be a finite number"),
                                ({"nvme_write_gbps": -1}, "nvme_write_gbps must be >= 0"),
                                ({"nvme_gbps": 0}, "nvme_gbps must be > 0"),
                                ({"device_tflops": True}, "device_tflops must be a number, got True")):
            with self.assertRaisesRegex(ValueError, message):
                dataclasses.replace(self.hw, **change)
        self.assertEqual(dataclasses.replace(self.hw, half_hidden=0).half_hidden, 0)  # no hidden-size effect
        # A Run's fields, before any arithmetic (with_memory=False skips the
        # estimator, which would refuse some of them too).
        run = perf_model.Run(model=self.model, micro_batch=4)
        for change, message in (({"micro_batch": 0}, "Run: micro_batch must be >= 1, got 0"),
                                ({"seq": 0}, "Run: seq must be >= 1, got 0"),
                                ({"accumulation": -1}, "Run: accumulation must be >= 1"),
                                ({"reduce_bucket_bytes": 0}, "Run: reduce_bucket_bytes must be >= 1"),
                                ({"stage": -1}, "Run: stage must be >= 0"),
                                ({"prefetch": "yes"}, "Run: prefetch must be a bool"),
                                ({"micro_batch": 2.0}, "Run: micro_batch must be an integer"),
                                ({"offload_optimizer": "disk"}, "offload_optimizer 'disk' is not none, cpu, nvme")):
            for call in (lambda r: perf_model.predict(r, self.hw, with_memory=False), perf_model.memory):
                with self.assertRaisesRegex(ValueError, message):
                    call(dataclasses.replace(run, **change))
        with self.assertRaisesRegex(ValueError, "multiple of model_parallel"):
            perf_model.predict(perf_model.Run(model=self.model, ranks=6, model_parallel=4), self.hw)
        with self.assertRaisesRegex(ValueError, "stage 3"):
            perf_model.predict(perf_model.Run(model=self.model, stage=2, offload_param="cpu"), self.hw)
        with self.assertRaisesRegex(ValueError, "dpu_values_on_device needs dpu"):
            perf_model.predict(perf_model.Run(model=self.model, stage=2, offload_optimizer="cpu",
                                              dpu_values_on_device=True), self.hw)
        with self.assertRaisesRegex(ValueError, "checkpointing"):
            perf_model.memory(perf_model.Run(model=self.model, ranks=4, model_parallel=4, checkpointing=False))

    def test_hardware_file_holds_the_committed_calibration(self):
        path = os.path.join("results", "perf_model_calibration", "calibration.csv")
        with open(path) as f:
            rows = [line.rstrip("\n").split(",") for line in f][1:]
        fitted = {r[1]: float(r[2]) for r in rows if r[0] == "v100_dgx2" and r[1] in ("compute_efficiency",
                                                                                      "half_hidden", "cpu_memory_gbps")}
        self.assertEqual(len(fitted), 3, rows)
        self.assertAlmostEqual(self.hw.cpu_memory_gbps, fitted["cpu_memory_gbps"], delta=0.5)
        self.assertAlmostEqual(self.hw.compute_efficiency, fitted["compute_efficiency"], delta=1e-3)
        self.assertAlmostEqual(self.hw.half_hidden, fitted["half_hidden"], delta=1)
        # Each GPU box's file holds what its calibration fitted, and the
        # 8-GPU H100 file the H100 box's compute constants (the same GPU
        # and kernels).
        for name in ("h100_box", "h200_box"):
            box = perf_model.load_hardware(name)
            fitted = {r[1]: float(r[2]) for r in rows if r[0] == name and r[1] in perf_model.DEVICE_FITTED_FIELDS}
            self.assertEqual(sorted(fitted), sorted(perf_model.DEVICE_FITTED_FIELDS), (name, rows))
            for field, value in fitted.items():
                self.assertAlmostEqual(getattr(box, field) / value, 1.0, places=4, msg=f"{name} {field}")
        box = perf_model.load_hardware("h100_box")
        dgx = perf_model.load_hardware("h100_80gb")
        self.assertAlmostEqual(dgx.compute_efficiency, box.compute_efficiency, delta=1e-4)
        self.assertEqual(dgx.half_hidden, box.half_hidden)


if __name__ == "__main__":
    unittest.main()
