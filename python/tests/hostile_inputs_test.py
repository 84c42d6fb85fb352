"""Hostile inputs against the command-line tools and the Python API.

One table, one row a case: what a hostile or careless user gives, and what
must come back instead of a signal, an abort, a hang or a silent success:
an exit code (or a Python exception) and the words the message must say.
Every case runs under a 30 s limit. A new class of bad input gets a row here
and its line in docs/reliability.md.
"""
import os
import shutil
import subprocess
import tempfile
import unittest

import memwall

MODELS = "models/configs/gpt.textproto"
TEXT = "data/quickstart.txt"
LIMIT_S = 30

# (name, argv with {tmp} and {ckpt} filled in, exit code, words of stderr)
CLI_CASES = [
    ("estimate: params past 2^53", ["repro/estimate", "--params=4611686018427387904"], 2, "must be < 2^53"),
    ("estimate: ranks past 2^20", ["repro/estimate", "--params=1000", "--ranks=4611686018427387904"], 2,
     "ranks = 4611686018427387904 must be <= 2^20"),
    ("estimate: micro_batch past 2^31", ["repro/estimate", f"--model={MODELS}", "--model_name=quickstart",
                                         "--set=micro_batch: 4611686018427387904"], 2,
     "micro_batch = 4611686018427387904 must be <= 2^31 - 1"),
    ("estimate: activations past 2^53 bytes", ["repro/estimate", "--model=models/configs/papers.textproto",
                                               "--model_name=offload_10b", "--set=micro_batch: 2000000 seq: 1024"],
     2, "bytes of activations, beyond the 2^53"),
    ("estimate: swap buffer_count INT64_MAX",
     ["repro/estimate", "--params=1000000", "--set=zero { stage: 3 offload_optimizer { device: CPU } offload_param "
      "{ device: NVME nvme_path: \"/tmp\" buffer_count: 9223372036854775807 } }"], 2,
     "offload_param.buffer_count = 9223372036854775807 must be <= 2^10"),
    ("estimate: accumulation past int64 names it", ["repro/estimate", "--params=10",
                                                    "--set=accumulation: 99999999999999999999"], 2,
     "(the value of accumulation)"),
    ("estimate: warmup_steps past int64 names it", ["repro/estimate", "--params=10",
                                                    "--set=schedule { warmup_steps: 99999999999999999999 }"], 2,
     "(the value of warmup_steps)"),
    ("estimate: a removed config field is named", ["repro/estimate", "--params=10",
                                                    "--set=zero { stage: 2 contiguous_gradients: true }"], 2,
     'ZeroConfig no longer has a field "contiguous_gradients"'),
    ("estimate: --config=/dev/zero", ["repro/estimate", "--params=10", "--config=/dev/zero"], 2,
     "--config /dev/zero is a character device, not a regular file"),
    ("estimate: --config a directory", ["repro/estimate", "--params=10", "--config={tmp}"], 2,
     "is a directory, not a regular file"),
    ("estimate: --config a FIFO", ["repro/estimate", "--params=10", "--config={tmp}/fifo"], 2,
     "is a FIFO (named pipe), not a regular file"),
    ("estimate: --model a symlink loop", ["repro/estimate", "--model={tmp}/loop_a"], 2,
     "is a loop of symbolic links"),
    ("estimate: --model a 300-byte name", ["repro/estimate", "--model={tmp}/" + "n" * 300], 2, "has a name too long"),
    ("train: --data=/dev/zero", ["train/train", "--steps=1", "--device=cpu", "--data=/dev/zero",
                                 "--out={tmp}/qs"], 1, "text file /dev/zero is a character device"),
    ("train: --data a directory", ["train/train", "--steps=1", "--device=cpu", "--data={tmp}",
                                   "--out={tmp}/qs"], 1, "is a directory, not a regular file"),
    ("consolidate: output over its own shard", ["zero/consolidate", "{ckpt}", "{ckpt}/rank_00000.shard"], 1,
     "is inside the checkpoint"),
    ("consolidate: output into the step directory", ["zero/consolidate", "{ckpt}", "{ckpt}/w.safetensors"], 1,
     "is inside the checkpoint"),
    ("consolidate: output a directory", ["zero/consolidate", "{ckpt}", "{tmp}"], 1, "is a directory"),
    ("consolidate: marker linked to /dev/zero", ["zero/consolidate", "{tmp}/zero_meta", "{tmp}/o.safetensors"], 1,
     "is a character device"),
    ("consolidate: FIFO marker", ["zero/consolidate", "{tmp}/fifo_marker", "{tmp}/o.safetensors"], 1,
     "is a FIFO (named pipe)"),
    ("consolidate: a symlink loop", ["zero/consolidate", "{tmp}/loop_a", "{tmp}/o.safetensors"], 1, "loop_a"),
    ("consolidate: a 300-byte name", ["zero/consolidate", "{tmp}/" + "n" * 300, "{tmp}/o.safetensors"], 1,
     "n" * 40),
    ("consolidate: an empty directory", ["zero/consolidate", "{tmp}/empty", "{tmp}/o.safetensors"], 1, "empty"),
    ("consolidate: a directory of other things", ["zero/consolidate", "{tmp}", "{tmp}/o.safetensors"],
     1, "is not a checkpoint; its subdirectory"),
    ("train: a DeepSpeed config nested 200000 deep", ["train/train", "--steps=1", "--device=cpu",
                                                      "--deepspeed_config={tmp}/deep.json", "--out={tmp}/qs"], 1,
     "arrays and objects nested deeper than 32 levels"),
    ("train: --resume the run's parent directory", ["train/train", "--steps=1", "--device=cpu", "--resume={tmp}",
                                                    "--out={tmp}/qs"], 1, "is not a checkpoint; its subdirectory"),
]


class HostileInputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        t = cls.tmp
        os.mkfifo(os.path.join(t, "fifo"))
        os.symlink(os.path.join(t, "loop_b"), os.path.join(t, "loop_a"))
        os.symlink(os.path.join(t, "loop_a"), os.path.join(t, "loop_b"))
        os.mkdir(os.path.join(t, "empty"))
        # A DeepSpeed config whose parse alone would take about 20 minutes.
        with open(os.path.join(t, "deep.json"), "w") as f:
            f.write('{"a": ' + "[" * 200000 + "]" * 200000 + "}")
        # A step directory whose marker and metadata are /dev/zero, and one
        # whose marker is a FIFO that nobody writes.
        os.mkdir(os.path.join(t, "zero_meta"))
        os.symlink("/dev/zero", os.path.join(t, "zero_meta", "COMPLETE"))
        os.symlink("/dev/zero", os.path.join(t, "zero_meta", "metadata.pb"))
        os.mkdir(os.path.join(t, "fifo_marker"))
        os.mkfifo(os.path.join(t, "fifo_marker", "COMPLETE"))
        open(os.path.join(t, "fifo_marker", "metadata.pb"), "w").close()
        # A real checkpoint.
        cls.model = memwall.model_config(MODELS, "quickstart")
        trainer = memwall.Trainer(cls.model, "seq: 32 micro_batch: 2 zero { stage: 1 }", data=TEXT)
        trainer.step()
        cls.ckpt = trainer.save(os.path.join(t, "run"))
        cls.trainer = trainer

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_command_line_tools(self):
        shard = os.path.join(self.ckpt, "rank_00000.shard")
        with open(shard, "rb") as f:
            before = f.read()
        for name, argv, code, words in CLI_CASES:
            with self.subTest(name):
                args = [a.replace("{tmp}", self.tmp).replace("{ckpt}", self.ckpt) for a in argv]
                try:
                    r = subprocess.run(args, capture_output=True, text=True, timeout=LIMIT_S)
                except subprocess.TimeoutExpired:
                    self.fail(f"{name}: still running after {LIMIT_S} s")
                self.assertGreaterEqual(r.returncode, 0, f"{name}: killed by signal {-r.returncode}: {r.stderr}")
                self.assertEqual(r.returncode, code, f"{name}: {r.stderr}")
                self.assertIn(words, r.stderr, name)
        with open(shard, "rb") as f:
            self.assertEqual(f.read(), before, "no case changed the checkpoint")

    def test_python_api(self):
        cases = [
            ("estimate(params=2**62)", lambda: memwall.estimate("", params=2**62), ValueError, "must be < 2^53"),
            ("estimate(ranks=2**62)", lambda: memwall.estimate("", params=10, ranks=2**62), ValueError,
             "must be <= 2^20"),
            ("Trainer(micro_batch: 2^62)",
             lambda: memwall.Trainer(self.model, "micro_batch: 4611686018427387904", data=TEXT), ValueError,
             "micro_batch = 4611686018427387904 must be <= 2^31 - 1"),
            ("Trainer(data=/dev/zero)", lambda: memwall.Trainer(self.model, "", data="/dev/zero"), ValueError,
             "is a character device"),
            ("Trainer(data=FIFO)", lambda: memwall.Trainer(self.model, "", data=os.path.join(self.tmp, "fifo")),
             ValueError, "is a FIFO"),
            ("model_config(/dev/zero)", lambda: memwall.model_config("/dev/zero", "x"), ValueError,
             "is a character device"),
            ("load_safetensors(directory)", lambda: memwall.load_safetensors(self.tmp), ValueError,
             "is a directory"),
            ("Trainer.export(directory)", lambda: self.trainer.export(self.tmp), IsADirectoryError,
             "it is a directory"),
            ("Trainer.load(the run's parent directory)", lambda: self.trainer.load(self.tmp), ValueError,
             "is not a checkpoint; its subdirectory"),
            ("cpu_adam threads=100000",
             lambda: memwall.cpu_adam.Adam([__import__("numpy").zeros(4, "float32")], threads=100000), ValueError,
             "threads"),
        ]
        for name, call, error, words in cases:
            with self.subTest(name):
                with self.assertRaises(error) as caught:
                    call()
                self.assertIn(words, str(caught.exception), name)


if __name__ == "__main__":
    unittest.main()
