"""//repro:infinity_memory in CI size (ci.textproto beside this file: 10B
and 1T over 16 ranks, modeled), then what it wrote, checked independently of the code that wrote it:
  - per model one formula row, then ZeRO-3, ZeRO-Inf-CPU, ZeRO-Inf-NVMe
    (the gradient shard in host memory), and every model state on NVMe;
  - the formula rows are ZeRO-Infinity §3's formulas recomputed here from the
    params, layers and hidden columns (bsz 1, seq 1024);
  - the estimator's model states over all ranks are at least 16 bytes a
    parameter and within 1% of it (shards padded, small parameters kept
    whole), the same whether on the device or offloaded to the CPU;
    ZeRO-Inf-NVMe's swap files hold at least the 14 bytes a parameter of
    16-bit parameters, master weights and Adam's moments (its total also
    counts the pinned swap buffers, tagged as the states they carry);
  - offloading moves bytes off the device: ZeRO-Inf-CPU's device per rank is
    below ZeRO-3's, its host bytes above; only the NVMe placements have NVMe
    bytes, and they hold less in host memory than ZeRO-Inf-CPU;
  - the gradient shard on NVMe moves its 2 bytes a parameter from the host
    to the drive, the device unchanged; so the trillion-parameter model's
    host memory per rank fits a DGX-2's (1.5 TB over 16 ranks), where with
    the gradients in host memory it does not;
  - a PNG and provenance.json exist."""
import os
import unittest

import results_check

RUNNER = results_check.runner_from_argv()
CPU, NVME, ALL = "stage3+offload+params", "stage3+nvme+nvme-params", "stage3+nvme-all"
DGX2_HOST_PER_RANK = 1.5 * 2**40 / 16  # the paper's TB is 2^40 bytes


class InfinityMemory(results_check.ResultsTest):
    def test_formulas_and_placements(self):
        directory = self.run_experiment(RUNNER, "repro/infinity/memory/ci.textproto")
        by_model = {}
        for r in results_check.rows(os.path.join(directory, "data.csv")):
            by_model.setdefault(r["model"], []).append(r)
        self.assertEqual(len(by_model), 2)
        for model, rows in by_model.items():
            self.assertEqual([r["placement"] for r in rows], ["any", "stage3", CPU, NVME, ALL], model)
            formula = rows[0]
            self.assertEqual(formula["source"], "paper formula")
            psi, nl, hd = int(formula["params"]), int(formula["layers"]), int(formula["hidden"])
            self.assertEqual(int(formula["model_states_total_bytes"]), 20 * psi, model)
            self.assertEqual(int(formula["activation_checkpoint_bytes_per_rank"]), 2 * 1024 * hd * nl, model)
            self.assertEqual(int(formula["model_state_working_bytes_per_rank"]), 16 * hd * hd, model)
            at = {r["placement"]: {k: int(v) for k, v in r.items() if k.endswith("_bytes") or k.endswith("_per_rank")}
                  for r in rows[1:]}
            for placement, r in at.items():
                states = r["model_states_total_bytes"]
                if placement not in (NVME, ALL):
                    self.assertTrue(16 * psi <= states <= 1.01 * 16 * psi, f"{model} {placement}: {states}")
                self.assertEqual(placement in (NVME, ALL), r["nvme_bytes_per_rank"] > 0,
                                 f"{model} {placement}: NVMe bytes")
            self.assertGreaterEqual(16 * at[NVME]["nvme_bytes_per_rank"], 14 * psi, f"{model}: NVMe holds too little")
            self.assertEqual(at["stage3"]["model_states_total_bytes"], at[CPU]["model_states_total_bytes"])
            self.assertGreaterEqual(at[NVME]["model_states_total_bytes"], at[CPU]["model_states_total_bytes"])
            self.assertLess(at[CPU]["device_bytes_per_rank"], at["stage3"]["device_bytes_per_rank"])
            self.assertGreater(at[CPU]["host_bytes_per_rank"], at["stage3"]["host_bytes_per_rank"])
            self.assertLess(at[NVME]["host_bytes_per_rank"], at[CPU]["host_bytes_per_rank"])
            # The gradient shard, 2 bytes a parameter over the ranks, moves
            # from the host to the drive (padding and the swap buffers aside).
            moved = at[ALL]["nvme_bytes_per_rank"] - at[NVME]["nvme_bytes_per_rank"]
            self.assertTrue(2 * psi / 16 <= moved <= 1.01 * 2 * psi / 16, f"{model}: {moved} bytes moved")
            freed = at[NVME]["host_bytes_per_rank"] - at[ALL]["host_bytes_per_rank"]
            self.assertGreater(freed, 0.95 * 2 * psi / 16, f"{model}: {freed} host bytes freed")
            self.assertEqual(at[ALL]["device_bytes_per_rank"], at[NVME]["device_bytes_per_rank"], model)
            if psi >= 10**12:
                self.assertGreater(at[NVME]["host_bytes_per_rank"], DGX2_HOST_PER_RANK, model)
                self.assertLess(at[ALL]["host_bytes_per_rank"], DGX2_HOST_PER_RANK, model)
        self.assert_figure_and_provenance(directory)


if __name__ == "__main__":
    unittest.main()
