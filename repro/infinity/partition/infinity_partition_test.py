"""//repro:infinity_partition end to end in CI size
(repro/infinity/partition/ci.textproto: 1, 2 and 4 ranks under
mpirun), then what it wrote, checked independently of the code that wrote
it:
  - one measured row per (world size, partitioning), and nothing else;
  - at each world size both partitionings gather the same bytes in the same
    number of gathers a step (every parameter of this model divides by the
    world size, so the bandwidth-centric padding is empty), and that is
    twice (forward and backward) at least the model's gathered weights in
    bf16;
  - every rate is positive;
  - a PNG and provenance.json naming the command exist."""
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
# The weights above param_persistence_threshold (1024): per layer c_attn
# 128 x 384, attn c_proj 128 x 128, c_fc 128 x 512, mlp c_proj 512 x 128;
# wte 256 x 128 and wpe 64 x 128.
WEIGHTS = 2 * (128 * 384 + 128 * 128 + 128 * 512 + 512 * 128) + 256 * 128 + 64 * 128
POSITIVE = ["gathers_per_step", "gathered_bytes_per_step", "gather_seconds_per_step", "gather_gb_per_s",
            "step_seconds", "tokens_per_second"]


class InfinityPartition(results_check.ResultsTest):
    def test_both_partitionings_gather_the_same_bytes(self):
        directory = self.run_experiment(RUNNER, "repro/infinity/partition/ci.textproto")
        seen = {}
        for r in results_check.rows(os.path.join(directory, "data.csv")):
            self.assertEqual(r["source"], "measured")
            key = (int(r["ranks"]), r["partitioning"])
            self.assertNotIn(key, seen, f"{key} twice")
            self.assertIn(r["partitioning"], ("contiguous", "bandwidth-centric"))
            for column in POSITIVE:
                self.assertGreater(float(r[column]), 0, f"{key}: {column}")
            self.assertGreaterEqual(int(r["gathered_bytes_per_step"]), 2 * 2 * WEIGHTS,
                                    f"{key}: below forward + backward of the weights")
            seen[key] = r
        world_sizes = {ranks for ranks, _ in seen}
        self.assertEqual(len(world_sizes), 3)
        for ranks in world_sizes:
            c, b = seen[(ranks, "contiguous")], seen[(ranks, "bandwidth-centric")]
            self.assertEqual(c["gathered_bytes_per_step"], b["gathered_bytes_per_step"], f"{ranks} ranks")
            self.assertEqual(c["gathers_per_step"], b["gathers_per_step"], f"{ranks} ranks")
        self.assert_figure_and_provenance(directory)


if __name__ == "__main__":
    unittest.main()
