"""tools/gpu_experiments.sh with a stand-in for the bundle's runner: each
experiment comes back as one tarball of its results folder, a failed run
and one cut short by the time limit are reported (and still packed), an
experiment with no time left is not started, and bad arguments are refused
before anything runs."""
import os
import shutil
import subprocess
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu_experiments.sh")

# The runner's stand-in: writes <results_dir>/<name>/{data.csv,
# provenance.json, traces/step_1.json}; a name with "slow" sleeps first, one
# with "fails" exits 3 after writing.
FAKE_RUN = r"""#!/usr/bin/env bash
dir="${1#--results_dir=}"
name="$(sed -n 's/^name:[[:space:]]*"\(.*\)"/\1/p' "$2")"
echo "[1/1] $name"
mkdir -p "$dir/$name/traces"
echo "model,tflops" > "$dir/$name/data.csv"
[[ "$name" == *slow* ]] && sleep 300
echo '{"commit": "abc"}' > "$dir/$name/provenance.json"
echo '{}' > "$dir/$name/traces/step_1.json"
[[ "$name" == *fails* ]] && exit 3
exit 0
"""


class GpuExperiments(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        bundle = os.path.join(self.root, "bundle")
        os.makedirs(os.path.join(bundle, "bin"))
        shutil.copy(SCRIPT, os.path.join(bundle, "experiments.sh"))
        with open(os.path.join(bundle, "env.sh"), "w") as f:
            f.write('bin="$here/bin"\n')
        runner = os.path.join(bundle, "bin", "repro_run")
        with open(runner, "w") as f:
            f.write(FAKE_RUN)
        os.chmod(runner, 0o755)
        self.script = os.path.join(bundle, "experiments.sh")
        self.out = os.path.join(self.root, "out")

    def experiment(self, name):
        path = os.path.join(self.root, name + ".textproto")
        with open(path, "w") as f:
            f.write(f'# an experiment\nname: "{name}"\nkind: OFFLOAD_THROUGHPUT\n')
        return path

    def run_script(self, *experiments, seconds=None):
        env = dict(os.environ)
        if seconds is not None:
            env["MEMWALL_SESSION_SECONDS"] = str(seconds)
        return subprocess.run(["bash", self.script, self.out, *experiments], capture_output=True, text=True,
                              env=env, cwd=self.root)

    def log(self):
        with open(os.path.join(self.out, "experiments.log")) as f:
            return f.read()

    def members(self, name):
        with tarfile.open(os.path.join(self.out, name + ".tar.gz")) as t:
            return sorted(t.getnames())

    def test_each_experiment_comes_back_as_one_file(self):
        r = self.run_script(self.experiment("alpha"), self.experiment("beta"))
        self.assertEqual(r.returncode, 0, r.stderr + self.log())
        self.assertEqual(sorted(os.listdir(self.out)), ["alpha.tar.gz", "beta.tar.gz", "experiments.log"])
        self.assertEqual(self.members("alpha"), ["alpha", "alpha/data.csv", "alpha/provenance.json", "alpha/traces",
                                                 "alpha/traces/step_1.json"])
        self.assertIn("[1/1] beta", self.log())
        self.assertIn("== alpha exit 0", self.log())

    def test_a_failed_run_and_one_out_of_time_are_reported(self):
        r = self.run_script(self.experiment("fails"), self.experiment("slow"), self.experiment("late"), seconds=45)
        self.assertNotEqual(r.returncode, 0)
        log = self.log()
        self.assertIn("== fails exit 3", log)
        self.assertIn("fails.tar.gz", os.listdir(self.out))  # what it wrote still comes back
        self.assertIn("(cut short by its limit)", log)
        self.assertEqual(self.members("slow"), ["slow", "slow/data.csv", "slow/traces"])
        self.assertIn("== late (", log)
        self.assertIn("not run: the command's time ran out", log)
        self.assertNotIn("late.tar.gz", os.listdir(self.out))

    def test_bad_arguments_are_refused_before_anything_runs(self):
        r = self.run_script()
        self.assertEqual(r.returncode, 2)
        self.assertIn("name at least one experiment", r.stderr)
        r = self.run_script(*[self.experiment(f"e{i}") for i in range(8)])
        self.assertEqual(r.returncode, 2)
        self.assertIn("8 experiments; at most 7", r.stderr)
        r = self.run_script("repro/no/such.textproto")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no repro/no/such.textproto here", r.stderr)
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    unittest.main()
