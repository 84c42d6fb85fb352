"""memwall.cpu_adam against a numpy reference of torch.optim.Adam / AdamW
(the textbook form with m_hat and v_hat, in float64) over 100 steps, for
float32, float16 and bf16 gradients; and the errors it raises."""
import unittest

import numpy as np

import memwall

# After t steps each parameter is within 8 sqrt(t) u |p| + 8 t u lr of the
# float64 reference, u = 2^-24: the bound cpu_adam_test.cc derives and
# checks over 1000 steps.
U = 2.0 ** -24


def reference(p, grads, lr, betas, eps, weight_decay, adamw, grad_scale):
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64) * grad_scale
        if adamw:
            p = p - lr * weight_decay * p
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


class CpuAdamTest(unittest.TestCase):
    def run_case(self, cls, adamw, grad_kind):
        rng = np.random.default_rng(7)
        sizes = [1, 7, 1023, 100_003]
        params = [rng.uniform(-1, 1, n).astype(np.float32) for n in sizes]
        start = [p.copy() for p in params]
        lr, betas, eps, wd, scale = 1e-3, (0.9, 0.999), 1e-8, 0.01, 0.5
        opt = cls(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
        history = [[] for _ in sizes]
        for _ in range(100):
            grads = []
            for i, n in enumerate(sizes):
                g = rng.uniform(-4, 4, n).astype(np.float32)
                if grad_kind == "float16":
                    g = g.astype(np.float16)
                    history[i].append(g.astype(np.float32))
                elif grad_kind == "bf16":
                    g = memwall.dtype.float32_to_bf16(g)
                    history[i].append(memwall.dtype.bf16_to_float32(g))
                else:
                    history[i].append(g)
                grads.append(g)
            opt.step(grads, grad_scale=scale)
        self.assertEqual(opt.steps, 100)
        for i in range(len(sizes)):
            want = reference(start[i], history[i], np.float32(lr), betas, np.float32(eps),
                             np.float32(wd), adamw, scale)
            bound = 8 * np.sqrt(100) * U * np.abs(want) + 8 * 100 * U * lr
            err = np.abs(params[i].astype(np.float64) - want)
            self.assertTrue(np.all(err <= bound),
                            f"{cls.__name__} {grad_kind} size {sizes[i]}: worst "
                            f"{np.max(err / bound):.3f} of the bound")

    def test_adam_matches_numpy(self):
        for kind in ["float32", "float16", "bf16"]:
            self.run_case(memwall.cpu_adam.Adam, False, kind)

    def test_adamw_matches_numpy(self):
        for kind in ["float32", "float16", "bf16"]:
            self.run_case(memwall.cpu_adam.AdamW, True, kind)

    def test_state_and_learning_rate(self):
        p = np.ones(10, np.float32)
        opt = memwall.cpu_adam.AdamW(p, lr=0.1, weight_decay=0.0)
        opt.step(np.full(10, 2.0, np.float32))
        # First step: m_hat = g, v_hat = g^2, so p moves by lr * g / (|g| + eps).
        np.testing.assert_allclose(p, 1 - 0.1, rtol=1e-6)
        np.testing.assert_allclose(opt.exp_avg[0], 0.2, rtol=1e-6)
        # (1 - beta2) is formed in float32: 1 - float32(0.999) = 0.00099998713.
        np.testing.assert_allclose(opt.exp_avg_sq[0], (np.float32(1) - np.float32(0.999)) * 4,
                                   rtol=1e-6)
        opt.lr = 0.0
        opt.step(np.full(10, 2.0, np.float32))
        np.testing.assert_allclose(p, 0.9, rtol=1e-6)
        self.assertIn(opt.path, ["scalar", "avx2", "avx512"])
        self.assertGreaterEqual(opt.threads, 1)

    def test_errors_name_the_argument(self):
        p = np.zeros(8, np.float32)
        # A thread count past four per core is refused before any thread starts.
        with self.assertRaisesRegex(ValueError, r"threads = 100000 must be in \[0, \d+\]"):
            memwall.cpu_adam.Adam([p], threads=100000)
        opt = memwall.cpu_adam.Adam([p])
        with self.assertRaisesRegex(ValueError, r"grads\[0\] has 7 elements; params\[0\] has 8"):
            opt.step([np.zeros(7, np.float32)])
        with self.assertRaisesRegex(ValueError, "1 gradients for 1 parameters|2 gradients for 1"):
            opt.step([np.zeros(8, np.float32), np.zeros(8, np.float32)])
        with self.assertRaisesRegex(ValueError, r"grads\[0\]: must be C-contiguous"):
            opt.step([np.zeros(16, np.float32)[::2]])
        with self.assertRaisesRegex(ValueError, r"grads\[0\]: element format 'd'"):
            opt.step([np.zeros(8, np.float64)])
        self.assertEqual(opt.steps, 0, "a refused step changes nothing")
        with self.assertRaisesRegex(ValueError, r"params\[0\]: parameters must be float32"):
            memwall.cpu_adam.Adam([np.zeros(8, np.float16)])
        frozen = np.zeros(8, np.float32)
        frozen.setflags(write=False)
        with self.assertRaisesRegex(ValueError, r"params\[0\]: needs a writable buffer"):
            memwall.cpu_adam.Adam([frozen])
        with self.assertRaisesRegex(ValueError, "Adam option lr = -1"):
            memwall.cpu_adam.Adam([p], lr=-1.0)
        with self.assertRaisesRegex(ValueError, "Adam option beta2 = 1"):
            memwall.cpu_adam.AdamW([p], betas=(0.9, 1.0))
        with self.assertRaisesRegex(ValueError, "Adam option lr = nan"):
            opt.lr = float("nan")


if __name__ == "__main__":
    unittest.main()
