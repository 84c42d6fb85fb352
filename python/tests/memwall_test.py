"""The memwall extension against numpy: fp16 conversion is checked against
numpy's own float16 cast (an independent implementation of IEEE rounding),
bf16 against an exact rational reference."""
import fractions
import unittest

import numpy as np

import memwall


class DTypeTest(unittest.TestCase):
    def test_fp16_matches_numpy_on_every_pattern_and_random_values(self):
        patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        wide = memwall.dtype.fp16_to_float32(patterns)
        finite = ~np.isnan(patterns.view(np.float16))
        np.testing.assert_array_equal(wide[finite], patterns.view(np.float16)[finite].astype(np.float32))
        np.testing.assert_array_equal(memwall.dtype.float32_to_fp16(wide), patterns)

        rng = np.random.default_rng(0)
        x = np.concatenate([
            rng.standard_normal(100_000).astype(np.float32) * 1000,
            rng.uniform(-1e-4, 1e-4, 100_000).astype(np.float32),   # fp16 subnormals
            np.float32([65504, 65519.99, 65520, 1e9, -np.inf, np.inf, 0.0, -0.0]),
        ])
        got = memwall.dtype.float32_to_fp16(x)
        want = x.astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(got, want)

    def test_bf16_rounds_to_nearest_even_exactly(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal(2000).astype(np.float32)
        got = memwall.dtype.bf16_to_float32(memwall.dtype.float32_to_bf16(x))
        for xi, gi in zip(x.tolist(), got.tolist()):
            # Neighbouring bf16 values around xi, by truncation and one ulp up.
            bits = np.float32(xi).view(np.uint32)
            lo = np.uint32(bits & 0xFFFF0000).view(np.float32)
            hi = np.uint32((bits & 0xFFFF0000) + 0x10000).view(np.float32)
            d_lo = abs(fractions.Fraction(float(xi)) - fractions.Fraction(float(lo)))
            d_hi = abs(fractions.Fraction(float(hi)) - fractions.Fraction(float(xi)))
            if d_lo < d_hi:
                want = lo
            elif d_hi < d_lo:
                want = hi
            else:  # tie: the even one
                want = lo if (np.float32(lo).view(np.uint32) >> 16) % 2 == 0 else hi
            self.assertEqual(gi, float(want), msg=f"x={xi!r}")

    def test_shape_is_kept(self):
        x = np.ones((3, 5), dtype=np.float32)
        self.assertEqual(memwall.dtype.float32_to_bf16(x).shape, (3, 5))

    def test_build_info(self):
        info = memwall.build_info()
        self.assertIn(info["convert_path"], ("scalar", "avx2+f16c", "avx512f"))
        self.assertIsInstance(info["cuda"], bool)


if __name__ == "__main__":
    unittest.main()
