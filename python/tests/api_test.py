"""The Python surface (python/README.md): a config as a text proto, a dict
or keyword arguments is the same config (the same estimate, the same
losses); every kind of failure raises its documented exception; paths may be
os.PathLike; latest_checkpoint finds what save wrote and prune_checkpoints
deletes all but the newest; the submodules import
as modules."""
import errno
import importlib
import json
import os
import pathlib
import tempfile
import unittest

import numpy as np

import memwall

MODEL_TEXT = "layers: 2 hidden: 64 heads: 4 vocab: 256 positions: 64"
MODEL = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "positions": 64}
TEXT = "data/quickstart.txt"


class ConfigFormsTest(unittest.TestCase):
    def test_text_dict_and_keywords_give_the_same_estimate(self):
        text = ("seq: 64 micro_batch: 4 precision: FP16 zero { stage: 3 offload_optimizer { device: CPU } "
                "offload_param { device: NVME nvme_path: '/tmp' } }")
        want = memwall.estimate(text, model=MODEL_TEXT, ranks=4)
        as_dict = {"seq": 64, "micro_batch": 4, "precision": "fp16",
                   "zero": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                            "offload_param": {"device": "NVME", "nvme_path": pathlib.Path("/tmp")}}}
        self.assertEqual(memwall.estimate(as_dict, model=MODEL, ranks=4), want)
        self.assertEqual(memwall.estimate(model=MODEL, ranks=4, **as_dict), want)
        # Keywords merge over the config, field by field, as --set does.
        merged = memwall.estimate({"seq": 64, "micro_batch": 4, "zero": {"stage": 3}}, model=MODEL, ranks=4,
                                  precision="FP16", zero={"offload_optimizer": {"device": "CPU"},
                                                          "offload_param": {"device": "NVME", "nvme_path": "/tmp"}})
        self.assertEqual(merged, want)
        # A numpy scalar is a number; None leaves a field unset.
        self.assertEqual(memwall.estimate(text, model=MODEL, ranks=4, micro_batch=np.int64(4), seed=None), want)
        self.assertEqual(memwall.estimate(params=10e9, ranks=64), memwall.estimate(params=10**10, ranks=64))

    def test_a_trainer_from_keywords_trains_as_one_from_text(self):
        text = memwall.Trainer(MODEL_TEXT, "seq: 32 micro_batch: 2 zero { stage: 2 }", data=TEXT)
        words = memwall.Trainer(MODEL, data=pathlib.Path(TEXT), seq=32, micro_batch=2, zero={"stage": 2})
        self.assertEqual([text.step()["loss"] for _ in range(3)], [words.step()["loss"] for _ in range(3)])

    def test_a_token_file_trains_as_its_text(self):
        tokens = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "quickstart.bin")
        np.fromfile(TEXT, np.uint8).astype("<u2").tofile(tokens)
        text = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2)
        ids = memwall.Trainer(MODEL, data=tokens, seq=32, micro_batch=2)  # ".bin": uint16 ids
        self.assertEqual([text.step()["loss"] for _ in range(2)], [ids.step()["loss"] for _ in range(2)])
        with self.assertRaisesRegex(ValueError, "data format 'u16' is not one of auto, text, uint16"):
            memwall.Trainer(MODEL, data=tokens, data_format="u16", seq=32)

    def test_a_deepspeed_config_trains_as_its_memwall_config(self):
        # DeepSpeed's ZeRO-Offload shape, as a dict and as a file; the
        # memwall config docs/deepspeed.md gives for it, written by hand,
        # trains the same losses.
        ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e5, "overlap_comm": True,
                                    "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme",
                                                          "buffer_count": 4, "pin_memory": False}},
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.1}}}
        got = memwall.deepspeed_config(ds, ranks=2)
        path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "ds_config.json")
        with open(path, "w") as f:
            json.dump(ds, f)
        from_file = memwall.deepspeed_config(pathlib.Path(path), ranks=2)
        self.assertEqual(from_file["config"], got["config"])
        self.assertEqual(from_file["lines"], got["lines"])
        self.assertIn("zero_optimization.stage = 2 -> zero.stage", got["lines"])
        self.assertIn("gradient_accumulation_steps (absent) -> accumulation: 2 (train_batch_size / (micro batch x "
                      "ranks))", got["lines"])
        self.assertEqual((got["train_batch_size"], got["steps_per_print"]), (8, 0))
        self.assertIsNone(got["activation_checkpointing"])
        by_hand = ("seq: 32 micro_batch: 2 accumulation: 2 precision: BF16 clip_norm: 1 "
                   "adam { lr: 0.003 beta1: 0.9 beta2: 0.95 eps: 1e-8 weight_decay: 0.1 adamw: true } "
                   "schedule { warmup_steps: 0 decay_steps: 0 } "
                   "zero { stage: 2 reduce_bucket_bytes: 1000000 overlap_comm: true offload_optimizer { device: CPU } }")
        translated = memwall.Trainer(MODEL, got["config"], data=TEXT, seq=32)
        written = memwall.Trainer(MODEL, by_hand, data=TEXT)
        self.assertEqual([translated.step()["loss"] for _ in range(3)], [written.step()["loss"] for _ in range(3)])
        # On one rank the same batch takes an accumulation of 4; on 3 it is
        # no whole number.
        self.assertIn("accumulation: 4", memwall.deepspeed_config(ds, ranks=1)["config"])
        with self.assertRaisesRegex(ValueError, "train_batch_size 8 is not a multiple of "
                                                "train_micro_batch_size_per_gpu 2 x 3 ranks"):
            memwall.deepspeed_config(ds, ranks=3)
        with self.assertRaisesRegex(ValueError, r"deepspeed_config \(a dict\): 1 key memwall cannot honour:\n  amp: "):
            memwall.deepspeed_config({"amp": {"enabled": True}})
        with self.assertRaises(FileNotFoundError):
            memwall.deepspeed_config(path + ".missing")
        with self.assertRaisesRegex(ValueError, "ranks = 0 must be >= 1"):
            memwall.deepspeed_config(ds, ranks=0)

    def test_a_wrong_field_type_or_value_is_named(self):
        cases = [
            ({"zero": {"stagee": 2}}, r"config: zero.stagee is not a field of ZeroConfig; its fields are stage, "),
            ({"zero": {"offload_optimizer": {"device": "cup"}}},
             r"config: zero.offload_optimizer.device = 'cup' is not one of NONE, CPU, NVME"),
            ({"micro_batch": "4"}, r"config: micro_batch = '4' must be an integer, not str"),
            ({"micro_batch": 4.0}, r"config: micro_batch = 4.0 must be an integer, not float"),
            ({"micro_batch": True}, r"config: micro_batch = True must be an integer, not bool"),
            ({"micro_batch": 2**64}, r"config: micro_batch = 18446744073709551616 is outside \["),
            ({"adam": {"lr": "0.1"}}, r"config: adam.lr = '0.1' must be a number, not str"),
            ({"adam": {"adamw": 1}}, r"config: adam.adamw = 1 must be True or False, not int"),
            ({"zero": 2}, r"config: zero must be a dict of ZeroConfig's fields, not int"),
            ({1: 2}, r"config: has a key 1 that is not a field name"),
            ({"micro_batch": -1}, r"micro_batch = -1 must be > 0"),  # the config's own validation
        ]
        for config, message in cases:
            with self.subTest(config=config), self.assertRaisesRegex(ValueError, message):
                memwall.estimate(config, model=MODEL, seq=64)
        with self.assertRaisesRegex(ValueError, r"model: headz is not a field of GptConfig"):
            memwall.estimate(model=dict(MODEL, headz=4))
        with self.assertRaisesRegex(TypeError, r"config must be a text proto \(str\), a dict of TrainingConfig"):
            memwall.estimate([("seq", 64)], model=MODEL)
        with self.assertRaisesRegex(TypeError, r"data must be a str or os.PathLike, not int"):
            memwall.Trainer(MODEL, data=3)
        # A NUL would end the path early at the system call: another file.
        with self.assertRaisesRegex(ValueError, "data: embedded null byte"):
            memwall.Trainer(MODEL, data=TEXT + "\0.ignored", seq=32)
        with self.assertRaisesRegex(ValueError, "nvme_path: embedded null byte"):
            memwall.estimate(model=MODEL, seq=64, zero={"offload_optimizer": {"device": "NVME", "nvme_path": "/tmp\0x"}})


class ErrorsTest(unittest.TestCase):
    """Each row of python/README.md's table of errors."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def trainer(self):
        return memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2)

    def test_files_are_os_errors_with_errno(self):
        with self.assertRaises(FileNotFoundError) as e:
            memwall.Trainer(MODEL, data=os.path.join(self.tmp, "no_such.txt"), seq=32)
        self.assertEqual(e.exception.errno, errno.ENOENT)
        self.assertIn("no_such.txt does not exist", str(e.exception))
        t = self.trainer()
        t.step()
        with self.assertRaisesRegex(FileNotFoundError, "no checkpoint at .*missing"):
            t.load(os.path.join(self.tmp, "missing"))
        step_dir = t.save(pathlib.Path(self.tmp) / "ckpt")
        with self.assertRaises(FileExistsError) as e:  # nothing saved over
            t.save(os.path.join(self.tmp, "ckpt"))
        self.assertEqual(e.exception.errno, errno.EEXIST)
        # A damaged checkpoint: OSError EIO, not ValueError.
        shard = os.path.join(step_dir, "rank_00000.shard")
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
        with self.assertRaises(OSError) as e:
            self.trainer().load(step_dir)
        self.assertEqual(e.exception.errno, errno.EIO, e.exception)
        self.assertIn("rank_00000.shard", str(e.exception))

    def test_bad_values_are_value_errors(self):
        with self.assertRaisesRegex(ValueError, "seq = 128 exceeds the model's 64 positions"):
            memwall.Trainer(MODEL, data=TEXT)  # the default seq, stated
        with self.assertRaisesRegex(ValueError, "no model config named 'nope'"):
            memwall.model_config("models/configs/gpt.textproto", "nope")

    def test_not_fitting_is_a_memory_error(self):
        huge = dict(MODEL, layers=96, hidden=12288, heads=96)  # 175B: more than this machine's memory
        with self.assertRaisesRegex(MemoryError, "does not fit"):
            memwall.Trainer(huge, data=TEXT, seq=32)

    def test_the_launch_options_are_checked_and_passed_on(self):
        with self.assertRaisesRegex(ValueError, "communication backend 'gloo' is not one of auto, mpi, nccl, tcp"):
            memwall.Trainer(MODEL, data=TEXT, seq=32, comm_backend="gloo")
        plain = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2)
        want = [plain.step()["loss"] for _ in range(2)]
        # One process asking for MPI gets an MPI world of one (auto would
        # not use MPI at all): the name reaches the communicator.
        mpi = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2, comm_backend="mpi")
        self.assertEqual((mpi.rank, mpi.world_size), (0, 1))
        self.assertEqual([mpi.step()["loss"] for _ in range(2)], want)
        # On the CpuDevice every rank has its own memory: sharing changes nothing.
        shared = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2, share_gpus=True)
        self.assertEqual([shared.step()["loss"] for _ in range(2)], want)

    def test_no_gpu_is_a_runtime_error(self):
        try:
            memwall.Trainer(MODEL, data=TEXT, seq=32, device="cuda")
        except RuntimeError as e:
            self.assertRegex(str(e), "CUDA")
            return
        self.skipTest("a GPU is visible: device='cuda' works here")


class PackageTest(unittest.TestCase):
    def test_submodules_import_as_modules(self):
        adam = importlib.import_module("memwall.cpu_adam")
        self.assertIs(adam.AdamW, memwall.cpu_adam.AdamW)
        from memwall.dtype import bf16_to_float32, float32_to_bf16
        np.testing.assert_array_equal(bf16_to_float32(float32_to_bf16(np.float32([1.5, -2.0]))), [1.5, -2.0])
        self.assertEqual(memwall._memwall.__name__, "memwall._memwall")
        with open(memwall.QUICKSTART_TEXT, "rb") as a, open(TEXT, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_latest_checkpoint_finds_what_save_wrote(self):
        tmp = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
        self.assertIsNone(memwall.latest_checkpoint(tmp / "none"))
        t = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2)
        saved = []
        for _ in range(2):
            t.step()
            saved.append(t.save(tmp))
        self.assertEqual(memwall.latest_checkpoint(tmp), saved[-1])
        # Keeping one deletes the older save, and only it.
        self.assertEqual(memwall.prune_checkpoints(tmp, 1), [saved[0]])
        self.assertFalse(os.path.exists(saved[0]))
        self.assertEqual(memwall.latest_checkpoint(tmp), saved[-1])
        with self.assertRaisesRegex(ValueError, "keep at least the newest one"):
            memwall.prune_checkpoints(tmp, 0)
        resumed = memwall.Trainer(MODEL, data=TEXT, seq=32, micro_batch=2)
        resumed.load(memwall.latest_checkpoint(tmp))
        self.assertEqual(resumed.steps, 2)
        self.assertEqual(resumed.step()["loss"], t.step()["loss"])
        path = tmp / "w.safetensors"
        t.export(path)
        self.assertTrue((tmp / "config.json").exists())
        self.assertIn("wte.weight", memwall.load_safetensors(path))

    def test_user_path_is_taken_from_where_bazel_run_started(self):
        saved = os.environ.pop("BUILD_WORKING_DIRECTORY", None)
        try:
            self.assertEqual(memwall.user_path("results"), "results")
            os.environ["BUILD_WORKING_DIRECTORY"] = "/home/me/memwall"
            self.assertEqual(memwall.user_path("results"), "/home/me/memwall/results")
            self.assertEqual(memwall.user_path("/tmp/r"), "/tmp/r")
            self.assertEqual(memwall.user_path(""), "", "an unset flag stays unset")
        finally:
            os.environ.pop("BUILD_WORKING_DIRECTORY", None)
            if saved is not None:
                os.environ["BUILD_WORKING_DIRECTORY"] = saved


if __name__ == "__main__":
    unittest.main()
