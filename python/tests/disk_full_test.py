"""A full disk, from Python: a save or an export that runs out of space
raises OSError with errno ENOSPC (python/README.md's Errors), leaves the
last checkpoint or the old file as it was, and costs the run nothing.

Run by infinity/disk_full_test.sh, which mounts a 4 MiB tmpfs of its own in
a private user and mount namespace and names it in MEMWALL_SMALL_DISK, as
for the C++ side.
"""
import errno
import os
import shutil
import unittest

import memwall

TEXT = "data/quickstart.txt"
MODEL = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "positions": 64}
CONFIG = "seq: 32 micro_batch: 2 zero { stage: 2 }"


class DiskFull(unittest.TestCase):
    def setUp(self):
        self.disk = os.environ.get("MEMWALL_SMALL_DISK")
        if self.disk is None:
            self.fail("run by infinity/disk_full_test.sh (//python:disk_full_test), which mounts the small disk")
        for name in os.listdir(self.disk):
            path = os.path.join(self.disk, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def fill_leaving(self, leave):
        """Fills the disk, then frees `leave` bytes: the next writes run out."""
        filler = os.path.join(self.disk, "filler")
        with open(filler, "wb") as f:
            block = b"x" * (64 << 10)
            try:
                while True:
                    f.write(block)
                    f.flush()
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC)
        size = os.path.getsize(filler)
        os.truncate(filler, max(0, size - leave))
        return filler

    def temporary_files(self):
        return [os.path.join(d, f) for d, _, files in os.walk(self.disk) for f in files if f.endswith(".tmp")]

    def test_a_save_that_runs_out_of_space_raises_enospc_and_keeps_the_last_checkpoint(self):
        trainer = memwall.Trainer(MODEL, CONFIG, data=TEXT)
        run = os.path.join(self.disk, "run")
        trainer.step()
        first = trainer.save(run)
        trainer.step()
        filler = self.fill_leaving(16 << 10)
        with self.assertRaises(OSError) as caught:
            trainer.save(run)
        self.assertEqual(caught.exception.errno, errno.ENOSPC, caught.exception)
        self.assertIn(os.path.join(run, "step_00000002"), str(caught.exception))
        self.assertEqual(memwall.latest_checkpoint(run), first)
        self.assertEqual(self.temporary_files(), [])
        # Nothing lost: with room again the run goes on, saves the step it
        # could not, and a fresh trainer resumes from it.
        os.remove(filler)
        second = trainer.save(run)
        self.assertEqual(memwall.latest_checkpoint(run), second)
        resumed = memwall.Trainer(MODEL, CONFIG, data=TEXT)
        resumed.load(second)
        went_on, from_checkpoint = trainer.step(), resumed.step()
        self.assertEqual(from_checkpoint["step"], 3)
        self.assertEqual(from_checkpoint["loss"], went_on["loss"])

    def test_an_export_that_runs_out_of_space_raises_enospc_and_keeps_the_old_file(self):
        trainer = memwall.Trainer(MODEL, CONFIG, data=TEXT)
        path = os.path.join(self.disk, "model.safetensors")
        trainer.step()
        trainer.export(path)
        names = set(memwall.load_safetensors(path))
        with open(path, "rb") as f:
            before = f.read()
        trainer.step()
        filler = self.fill_leaving(16 << 10)
        with self.assertRaises(OSError) as caught:
            trainer.export(path)
        self.assertEqual(caught.exception.errno, errno.ENOSPC, caught.exception)
        self.assertIn(path, str(caught.exception))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), before, "the old export was changed")
        self.assertEqual(self.temporary_files(), [])
        # With room again the same export is written whole: the weights
        # after the second step.
        os.remove(filler)
        trainer.export(path)
        self.assertEqual(set(memwall.load_safetensors(path)), names)
        with open(path, "rb") as f:
            self.assertNotEqual(f.read(), before)


if __name__ == "__main__":
    unittest.main()
