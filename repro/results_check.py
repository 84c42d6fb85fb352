"""What the repro tests share: run //repro:run on an experiment, read what it
wrote by its CSV headers, and check the figure and the provenance record.

The tests check results independently of the code that wrote them: each
recomputes what a row must hold from the row's own columns, named by the
header, never by position."""
import csv
import json
import os
import re
import subprocess
import sys
import unittest


def runner_from_argv():
    """The runner's path: the test's first argument (Bazel's $(location :run)),
    removed so that unittest sees its own."""
    if len(sys.argv) < 2:
        raise SystemExit("usage: TEST RUNNER [unittest arguments]")
    return sys.argv.pop(1)


def results_root():
    return os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "results")


def run(runner, experiment, *flags, results_dir=None):
    """Runs the runner on `experiment`, writing under `results_dir`
    (results_root() by default); (exit code, stdout + stderr)."""
    done = subprocess.run([runner, experiment, f"--results_dir={results_dir or results_root()}", *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(done.stdout)
    return done.returncode, done.stdout


def experiment_name(path):
    """The `name` an experiment text proto gives (its results/<name>/)."""
    with open(path, encoding="utf-8") as handle:
        return re.search(r'^\s*name:\s*"([^"]+)"', handle.read(), re.M).group(1)


def rows(path):
    """A CSV's rows as dicts keyed by its header."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


class ResultsTest(unittest.TestCase):
    """A test of one experiment's results/<name>/."""

    def run_experiment(self, runner, experiment):
        """Runs `experiment` (a text proto), which must succeed; the
        results/<name>/ directory of the name it gives."""
        code, _ = run(runner, experiment)
        self.assertEqual(code, 0, f"the runner on {experiment}")
        return os.path.join(results_root(), experiment_name(experiment))

    def assert_command(self, directory, experiment):
        """provenance.json's command is the one a user types to regenerate
        these results: the runner on `experiment` into the same root."""
        with open(os.path.join(directory, "provenance.json"), encoding="utf-8") as handle:
            command = json.load(handle)["command"]
        self.assertRegex(command, r"^\./bazelw run //repro:run -- " + re.escape(experiment) + " --results_dir=")

    def ladder_walks(self, data, key):
        """Rows of max-model walks, one walk per value of `key(row)`: each
        goes up its ladder and stops at its first refusal, whose reason says
        "does not fit". {walk: (the rows that trained, the refusal or None)}."""
        walks = {}
        for r in data:
            trained, refusal = walks.setdefault(key(r), ([], [None]))
            where = f"{key(r)} {r['model']}"
            self.assertIsNone(refusal[0], f"{where}: a row after its walk's refusal")
            if r["fits"] == "no":
                self.assertIn("does not fit", r["reason"], where)
                refusal[0] = r
            else:
                trained.append(r)
        return {k: (trained, refusal[0]) for k, (trained, refusal) in walks.items()}

    def assert_figure_and_provenance(self, directory):
        with open(os.path.join(directory, "figure.png"), "rb") as handle:
            self.assertEqual(handle.read(4), b"\x89PNG", "figure.png is not a PNG")
        with open(os.path.join(directory, "provenance.json"), encoding="utf-8") as handle:
            provenance = json.load(handle)
        for key in ("experiment", "commit", "date", "command", "machine", "measured_or_modeled", "files"):
            self.assertIn(key, provenance)
        for key in ("cpu", "cores", "memory_gib", "gpu"):
            self.assertIn(key, provenance["machine"])
