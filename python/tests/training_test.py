"""memwall.estimate, memwall.Trainer and memwall.load/save_safetensors
against the C++ tools: the estimate equals //repro:estimate's JSON; a Python
trainer's losses and exported weights equal //:train's on the same
config (1 rank and 2 ranks under mpirun); a checkpoint saved and loaded in
Python continues the run exactly."""
import errno
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import memwall

PAPERS = "models/configs/papers.textproto"
MODELS = "models/configs/gpt.textproto"
TEXT = "data/quickstart.txt"
STEPS = 3


def quickstart_config(model_text, steps):
    """//:train's TrainingConfig when no --config is given (train/train.cc sets these)."""
    positions = int(re.search(r"positions: (\d+)", model_text).group(1))
    return (f"seq: {positions} micro_batch: 8 precision: BF16 adam {{ lr: 0.002 weight_decay: 0.01 }} "
            f"schedule {{ warmup_steps: 20 decay_steps: {steps} }}")


def run_quickstart(out, ranks=1):
    cmd = ["train/train", f"--steps={STEPS}", "--device=cpu", f"--out={out}"]
    if ranks > 1:
        cmd = ["tools/mpi_test_runner.sh", str(ranks)] + cmd
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    first, last = re.search(r"first loss ([0-9.]+), last loss ([0-9.]+)", text).groups()
    return float(first), float(last)


class EstimateTest(unittest.TestCase):
    def check_same_as_tool(self, name, config, ranks):
        model = memwall.model_config(PAPERS, name)
        got = memwall.estimate(config, model=model, ranks=ranks, device_bytes=32 << 30)
        tool = subprocess.run(
            ["repro/estimate", f"--model={PAPERS}", f"--model_name={name}", f"--ranks={ranks}", f"--set={config}",
             "--device_bytes=34359738368", "--format=json"], capture_output=True, text=True)
        self.assertIn(tool.returncode, (0, 1), tool.stderr)
        self.assertEqual(got, json.loads(tool.stdout))
        return got

    def test_paper_models_equal_the_command_line_tool(self):
        offload = self.check_same_as_tool("offload_10b", "zero { stage: 2 offload_optimizer { device: CPU } }", 1)
        self.assertGreater(offload["host_bytes_per_rank"], 12 * offload["params"])  # fp32 master + m + v on the host
        stage0 = self.check_same_as_tool("offload_10b", "zero { stage: 0 }", 1)
        self.assertFalse(stage0["fits"])   # ZeRO-Offload §6.2.1: 10B does not fit one 32 GB GPU without offload
        self.assertTrue(offload["fits"])
        nvme = self.check_same_as_tool(
            "offload_10b", "zero { stage: 3 offload_optimizer { device: NVME nvme_path: '/tmp' } }", 16)
        self.assertGreater(nvme["nvme_bytes_per_rank"], 0)
        # The gradient shard on NVMe too: its 2 bytes a parameter of the
        # shard move from pinned host memory to the drive.
        every = self.check_same_as_tool(
            "offload_10b",
            "zero { stage: 3 offload_optimizer { device: NVME nvme_path: '/tmp' gradients_on_nvme: true } }", 16)
        shard_grads = 2 * every["params"] / 16
        self.assertGreater(nvme["host_bytes_per_rank"] - every["host_bytes_per_rank"], 0.95 * shard_grads)
        self.assertGreaterEqual(every["nvme_bytes_per_rank"] - nvme["nvme_bytes_per_rank"], shard_grads)
        with self.assertRaisesRegex(ValueError, "gradients_on_nvme = true with delayed_update_after_steps = 2"):
            memwall.estimate("zero { stage: 3 offload_optimizer { device: NVME nvme_path: '/tmp' "
                             "gradients_on_nvme: true delayed_update_after_steps: 2 } }", params=1 << 20)

    def test_params_alone_follow_the_zero_formula(self):
        psi = 1 << 30
        for stage, per_rank in ((0, 16 * psi), (1, 4 * psi + 12 * psi // 64), (2, 2 * psi + 14 * psi // 64),
                                (3, 16 * psi // 64)):
            e = memwall.estimate(f"zero {{ stage: {stage} }}", params=psi, ranks=64)
            self.assertEqual(e["model_states_bytes_per_rank"], per_rank, msg=f"stage {stage}")

    def test_bad_input_names_what_is_wrong(self):
        with self.assertRaisesRegex(ValueError, "stage"):
            memwall.estimate("zero { stage: 7 }", params=10)
        with self.assertRaisesRegex(ValueError, "config"):
            memwall.estimate("zero { stag: 1 }", params=10)
        with self.assertRaisesRegex(ValueError, "exactly one"):
            memwall.estimate("", params=0)
        with self.assertRaisesRegex(ValueError, "no_such_model"):
            memwall.model_config(PAPERS, "no_such_model")

    def test_sizes_that_would_overflow_are_refused(self):
        # Each once killed the interpreter or said "fits".
        with self.assertRaisesRegex(ValueError, r"params = 4611686018427387904 must be < 2\^53"):
            memwall.estimate("", params=2**62)
        with self.assertRaisesRegex(ValueError, r"ranks = 4611686018427387904 must be <= 2\^20"):
            memwall.estimate("", params=1000, ranks=2**62)
        model = memwall.model_config(PAPERS, "offload_10b")
        with self.assertRaisesRegex(ValueError, r"micro_batch = 4611686018427387904 must be <= 2\^31 - 1"):
            memwall.estimate("micro_batch: 4611686018427387904", model=model)
        with self.assertRaisesRegex(ValueError, r"\(the value of accumulation\)"):
            memwall.estimate("accumulation: 99999999999999999999", params=10)


class TrainerTest(unittest.TestCase):
    def setUp(self):
        self.model = memwall.model_config(MODELS, "quickstart")
        self.config = quickstart_config(self.model, STEPS)
        self.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def test_losses_and_weights_equal_the_train_command(self):
        trainer = memwall.Trainer(self.model, self.config, data=TEXT)
        losses = [trainer.step()["loss"] for _ in range(STEPS)]
        self.assertEqual(trainer.steps, STEPS)
        self.assertEqual(trainer.world_size, 1)
        first, last = run_quickstart(os.path.join(self.tmp, "cc"))
        self.assertAlmostEqual(losses[0], first, places=4)
        self.assertAlmostEqual(losses[-1], last, places=4)
        path = os.path.join(self.tmp, "py.safetensors")
        trainer.export(path)
        ours = memwall.load_safetensors(path)
        theirs = memwall.load_safetensors(os.path.join(self.tmp, "cc", "model.safetensors"))
        self.assertEqual(list(ours), list(theirs))
        for name in ours:
            np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
        self.assertEqual(ours["wte.weight"].shape, (256, 128))

    def test_a_checkpoint_continues_the_run_exactly(self):
        config = self.config + " zero { stage: 2 }"
        a = memwall.Trainer(self.model, config, data=TEXT)
        a.step()
        step_dir = a.save(os.path.join(self.tmp, "ckpt"))
        self.assertRegex(step_dir, r"step_0*1$")
        want = [a.step()["loss"] for _ in range(2)]
        b = memwall.Trainer(self.model, config, data=TEXT)
        b.load(step_dir)
        self.assertEqual(b.steps, 1)
        self.assertEqual([b.step()["loss"] for _ in range(2)], want)
        with self.assertRaisesRegex(FileNotFoundError, "missing_dir"):
            b.load(os.path.join(self.tmp, "missing_dir"))

    def test_saving_under_the_delayed_update_does_not_change_the_run(self):
        config = self.config + " zero { stage: 2 offload_optimizer { device: CPU delayed_update_after_steps: 1 } }"
        never = memwall.Trainer(self.model, config, data=TEXT)
        want = [never.step()["loss"] for _ in range(5)]
        every = memwall.Trainer(self.model, config, data=TEXT)
        ckpt = os.path.join(self.tmp, "dpu")
        got = []
        for i in range(5):
            got.append(every.step()["loss"])
            every.save(ckpt)
            every.export(os.path.join(self.tmp, f"dpu_{i}.safetensors"))
        self.assertEqual(got, want)
        # The export holds the weights the next step computes with; applying
        # the pending update moves them.
        every.apply_pending_update()
        every.export(os.path.join(self.tmp, "dpu_applied.safetensors"))
        before = memwall.load_safetensors(os.path.join(self.tmp, "dpu_4.safetensors"))
        after = memwall.load_safetensors(os.path.join(self.tmp, "dpu_applied.safetensors"))
        self.assertFalse(np.array_equal(before["wte.weight"], after["wte.weight"]))
        # A checkpoint holding a pending update continues the run exactly.
        resumed = memwall.Trainer(self.model, config, data=TEXT)
        resumed.load(os.path.join(ckpt, "step_00000002"))
        self.assertEqual([resumed.step()["loss"] for _ in range(3)], want[2:])

    def test_bad_input_names_what_is_wrong(self):
        with self.assertRaisesRegex(FileNotFoundError, "no_such.txt"):
            memwall.Trainer(self.model, self.config, data="no_such.txt")
        with self.assertRaisesRegex(ValueError, "micro_batch"):
            memwall.Trainer(self.model, "micro_batch: -1", data=TEXT)
        with self.assertRaisesRegex(ValueError, r"micro_batch = 4611686018427387904 must be <= 2\^31 - 1"):
            memwall.Trainer(self.model, "micro_batch: 4611686018427387904", data=TEXT)
        with self.assertRaisesRegex(ValueError, "text file /dev/zero is a character device, not a regular file"):
            memwall.Trainer(self.model, self.config, data="/dev/zero")
        with self.assertRaisesRegex(ValueError, "is a directory, not a regular file"):
            memwall.Trainer(self.model, self.config, data=self.tmp)

    def test_two_threads_cannot_use_one_trainer_at_once(self):
        import threading
        trainer = memwall.Trainer(self.model, self.config, data=TEXT)
        refused, other, done = [], [], [0]

        def step():
            try:
                trainer.step()
                done[0] += 1
            except RuntimeError as e:
                refused.append(str(e))
            except Exception as e:  # noqa: BLE001 (anything else is the failure)
                other.append(repr(e))

        for _ in range(10):
            threads = [threading.Thread(target=step) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if refused:
                break
        self.assertEqual(other, [])
        self.assertTrue(refused, "two threads stepping at once were never refused")
        self.assertIn("memwall.Trainer is in use by another thread", refused[0])
        self.assertEqual(trainer.steps, done[0], "every step that ran counted once")

    def run_two_ranks(self, name, script, timeout=None):
        """Standard output of `script` (Python source) run by 2 ranks under mpirun."""
        path = os.path.join(self.tmp, name + ".py")
        with open(path, "w") as f:
            f.write(script)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        return subprocess.run(["tools/mpi_test_runner.sh", "2", sys.executable, path], env=env, check=True,
                              capture_output=True, text=True, timeout=timeout).stdout

    def test_two_ranks_under_mpirun_equal_the_train_command(self):
        out = self.run_two_ranks("two_ranks", f"""
import memwall
t = memwall.Trainer({self.model!r}, {self.config!r}, data={TEXT!r})
losses = [t.step()["loss"] for _ in range({STEPS})]
print("RESULT", t.rank, t.world_size, " ".join(f"{{l:.4f}}" for l in losses))
""")
        results = sorted(re.findall(r"RESULT (\d) (\d) (.*)", out))
        self.assertEqual([r[:2] for r in results], [("0", "2"), ("1", "2")], out)
        self.assertEqual(results[0][2], results[1][2])  # every rank reports the global loss
        first, last = run_quickstart(os.path.join(self.tmp, "cc2"), ranks=2)
        losses = [float(x) for x in results[0][2].split()]
        self.assertAlmostEqual(losses[0], first, places=4)
        self.assertAlmostEqual(losses[-1], last, places=4)

    def test_a_rank_with_a_bad_local_path_fails_every_rank(self):
        # Before, rank 0 went on into the first collective and waited there
        # for the watchdog (600 s) while rank 1 had raised.
        out = self.run_two_ranks("bad_rank", f"""
import os, memwall
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
try:
    memwall.Trainer({self.model!r}, {self.config!r}, data={TEXT!r} if rank == 0 else "no_such_dir/text.txt")
    print("CREATED", rank)
except FileNotFoundError as e:
    print("REFUSED", rank, e)
""", timeout=60)
        self.assertNotIn("CREATED", out)
        self.assertRegex(out, r"REFUSED 0 .*failed on rank\(s\) 1; rank 1: .*no_such_dir/text.txt")
        self.assertRegex(out, r"REFUSED 1 .*no_such_dir/text.txt")

    def test_a_save_rank_0_cannot_prepare_raises_the_same_oserror_on_every_rank(self):
        # Rank 0 prepares the checkpoint directory; a file stands where it
        # must go, and its errno (ENOTDIR) reaches rank 1 with the failure:
        # both raise NotADirectoryError, not an OSError of another kind.
        blocker = os.path.join(self.tmp, "a_file")
        open(blocker, "w").close()
        out = self.run_two_ranks("save_fails", f"""
import memwall
t = memwall.Trainer({self.model!r}, {self.config!r}, data={TEXT!r})
t.step()
try:
    t.save({os.path.join(blocker, "ckpt")!r})
    print("SAVED", t.rank)
except OSError as e:
    print("REFUSED", t.rank, type(e).__name__, e.errno, e)
""", timeout=120)
        self.assertNotIn("SAVED", out)
        self.assertRegex(out, rf"REFUSED 0 NotADirectoryError {errno.ENOTDIR} .*a_file/ckpt")
        self.assertRegex(out, rf"REFUSED 1 NotADirectoryError {errno.ENOTDIR} .*failed on rank\(s\) 0")


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_and_errors(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(tmp, "t.safetensors")
        rng = np.random.default_rng(0)
        tensors = {"a": rng.standard_normal((3, 4)).astype(np.float32),
                   "b": rng.standard_normal(5).astype(np.float16),
                   "c": np.arange(6, dtype=np.int32).reshape(2, 3)}
        memwall.save_safetensors(path, tensors)
        back = memwall.load_safetensors(path)
        self.assertEqual(list(back), ["a", "b", "c"])
        for k, v in tensors.items():
            self.assertEqual(back[k].dtype, v.dtype)
            np.testing.assert_array_equal(back[k], v)
        # The format by hand: 8-byte length, JSON header, data at the stated offsets.
        with open(path, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        lo, hi = header["a"]["data_offsets"]
        np.testing.assert_array_equal(np.frombuffer(raw[8 + n + lo:8 + n + hi], np.float32).reshape(3, 4),
                                      tensors["a"])
        with self.assertRaisesRegex(ValueError, "float64"):
            memwall.save_safetensors(path, {"x": np.zeros(2)})
        with open(os.path.join(tmp, "bad.safetensors"), "wb") as f:
            f.write(raw[:-4])  # truncated data
        with self.assertRaisesRegex(ValueError, "bad.safetensors"):
            memwall.load_safetensors(os.path.join(tmp, "bad.safetensors"))

    def test_writer_cannot_corrupt(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(tmp, "w.safetensors")
        # Big-endian arrays are converted to the format's little-endian.
        x = np.arange(6, dtype=">f4").reshape(2, 3) / 7
        memwall.save_safetensors(path, {"x": x, "y": np.arange(3, dtype=">i4")})
        back = memwall.load_safetensors(path)
        np.testing.assert_array_equal(back["x"], x.astype("<f4"))
        np.testing.assert_array_equal(back["y"], np.arange(3, dtype=np.int32))
        # Names and metadata with JSON's special characters: the header is
        # JSON that Python's own parser reads back to the same strings.
        names = ['a"quote', "back\\slash", "tab\tnew\nline", "ctl\x01", "caf\u00e9", "\U0001f600"]
        meta = {"format": "pt", 'note "q"': "c:\\dir\\x"}
        memwall.save_safetensors(path, {n: np.full(2, i, np.float32) for i, n in enumerate(names)}, meta)
        with open(path, "rb") as f:
            raw = f.read()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        self.assertEqual(header.pop("__metadata__"), meta)
        self.assertEqual(list(header), names)
        back = memwall.load_safetensors(path)
        self.assertEqual(list(back), names)
        for i, n in enumerate(names):
            np.testing.assert_array_equal(back[n], np.full(2, i, np.float32))
        # The reserved key, an empty name: refused, and nothing is written.
        for bad, words in [("__metadata__", "reserved"), ("", "empty name")]:
            target = os.path.join(tmp, "refused.safetensors")
            with self.assertRaisesRegex(ValueError, words):
                memwall.save_safetensors(target, {bad: np.zeros(2, np.float32)})
            self.assertFalse(os.path.exists(target))


if __name__ == "__main__":
    unittest.main()
