"""//repro:infinity_prefetch end to end in CI size (ci.textproto beside this
file), checked by paired_check.py: each model without, then with
overlap-centric prefetch, every run trained, summary.csv's ratios
recomputed from data.csv, a figure and a provenance record, no swap file
left behind."""
import paired_check
import results_check

RUNNER = results_check.runner_from_argv()


class InfinityPrefetch(paired_check.PairedTest):
    def test_prefetch(self):
        self.check_pairs(RUNNER, "repro/infinity/prefetch/ci.textproto", "+prefetch")


if __name__ == "__main__":
    paired_check.main()
