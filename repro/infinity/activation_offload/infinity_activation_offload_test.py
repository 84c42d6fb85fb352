"""//repro:infinity_activation_offload end to end in CI size (ci.textproto
beside this file), checked by paired_check.py (each model without, then
with the checkpoints offloaded, every run trained, summary.csv's ratios
recomputed, a figure and a provenance record, no swap file left behind),
and here: 5-layer models keep 3 of their 6 checkpoints on the device, so
the device peak falls by exactly 3 and the pinned host peak grows by
exactly 6 checkpoints of micro_batch x seq x hidden bf16 activations
(2 x 32 rows, 2 bytes each: ci.textproto trains in bf16)."""
import paired_check
import results_check

RUNNER = results_check.runner_from_argv()


class InfinityActivationOffload(paired_check.PairedTest):
    def test_activation_offload(self):
        runs = self.check_pairs(RUNNER, "repro/infinity/activation_offload/ci.textproto", "+activation-offload")
        for model in {m for m, _ in runs}:
            off, on = runs[(model, False)], runs[(model, True)]
            checkpoint = 2 * 32 * int(off["hidden"]) * 2
            self.assertEqual(int(off["device_peak_bytes"]) - int(on["device_peak_bytes"]), 3 * checkpoint, model)
            self.assertEqual(int(on["host_pinned_peak_bytes"]) - int(off["host_pinned_peak_bytes"]),
                             6 * checkpoint, model)


if __name__ == "__main__":
    paired_check.main()
