"""The box's NVMe rate from a max-model walk (nvme_gbps_of): perf_model's
24 bytes a parameter over the optimizer zone of the largest model that
trained, the swap waits inside that zone; smaller models, refused ones and
rows without the zone do not count, and no such row gives None."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_model_calibration as calibration  # noqa: E402


def row(params, fits="yes", breakdown=""):
    return {"params": str(params), "fits": fits, "breakdown": breakdown}


class NvmeRate(unittest.TestCase):
    def test_the_largest_trained_models_optimizer_zone(self):
        rows = [row(10**8, breakdown="cpu_adam 1.0, forward+backward 0.5"),
                row(10**9, breakdown="cpu_adam 12.0, forward+backward 3.0, swap wait 11.5, "
                                     "swap-in 10.0 @ 1.20 GB/s, swap-out 9.0 @ 1.33 GB/s"),
                row(2 * 10**9, fits="no")]
        # 24 bytes x 1e9 parameters in 12 s.
        self.assertAlmostEqual(calibration.nvme_gbps_of(rows), 2.0)

    def test_no_optimizer_zone_no_rate(self):
        self.assertIsNone(calibration.nvme_gbps_of([]))
        self.assertIsNone(calibration.nvme_gbps_of([row(10**9, breakdown="adam 0.2, forward+backward 1.0")]))
        self.assertIsNone(calibration.nvme_gbps_of([row(10**9, fits="no", breakdown="cpu_adam 1.0")]))


if __name__ == "__main__":
    unittest.main()
