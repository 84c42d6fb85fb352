"""Docs that cannot drift: over every README, doc and comment in the tree,
  - every repository path named (zero/trainer.h, docs/reliability.md,
    results/fuzz/) exists, as does every bare *.md name beside its file;
  - nothing cites a file outside the repository (../shared/...);
  - every [Note: X] cited has exactly one definition (a comment line that
    holds it alone, or with a parenthetical: "// [Note: X] (ZeRO §5.1)");
  - no code or doc carries issue numbers: docs are for users.
The files come from each package's :doc_sources (every file it holds)."""
import os
import re
import unittest

TEXT = re.compile(r"\.(md|cc|h|py|sh|proto|bzl|cu|cuh|textproto)$|(^|/)BUILD$|^\.ci/run$|^bazelw$")
EXTENSIONS = "h|cc|md|py|sh|proto|textproto|bzl|cu|cuh|txt|json|csv|svg|png"


def repository_files():
    files = []
    for root, _, names in os.walk("."):
        for name in names:
            path = os.path.relpath(os.path.join(root, name), ".")
            if not path.startswith(("external/", "bazel-", "_")) and ".runfiles" not in path:
                files.append(path)
    return sorted(files)


def comment_text(path, text):
    """The prose of a file: all of a Markdown file, the comments of code."""
    if path.endswith(".md"):
        return text
    mark = "//" if re.search(r"\.(cc|h|cu|cuh|proto)$", path) else "#"
    return "\n".join(line[line.find(mark) + len(mark):] for line in text.splitlines() if mark in line)


class DocCheck(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.files = repository_files()
        cls.existing = set(cls.files)
        cls.dirs = {os.path.dirname(f) for f in cls.files}
        for d in list(cls.dirs):
            while d:
                d = os.path.dirname(d)
                cls.dirs.add(d)
        cls.tops = sorted({f.split("/")[0] for f in cls.files if "/" in f and not f.startswith(".")})
        cls.prose = {}
        for f in cls.files:
            if TEXT.search(f):
                with open(f, encoding="utf-8", errors="replace") as handle:
                    cls.prose[f] = comment_text(f, handle.read())

    def exists(self, path, beside):
        for candidate in (path, os.path.normpath(os.path.join(os.path.dirname(beside), path))):
            c = candidate.rstrip("/")
            if c in self.existing or c in self.dirs:
                return True
            if c.endswith(".pb.h") and c[:-len(".pb.h")] + ".proto" in self.existing:
                return True  # generated from the .proto
        return False

    def test_the_tree_was_found(self):
        self.assertIn("README.md", self.existing)
        self.assertIn("zero/trainer.h", self.existing)
        self.assertGreater(len(self.prose), 100)

    def test_every_named_path_exists(self):
        tops = "|".join(re.escape(t) for t in self.tops)
        path = re.compile(r"(?<![\w/.<>{}*$-])((?:%s)/(?:[A-Za-z0-9_.-]+/)*(?:[A-Za-z0-9_-]+\.(?:%s)\b|(?=\s)))"
                          % (tops, EXTENSIONS))
        bare_md = re.compile(r"(?<![\w/.-])([A-Za-z0-9_-]+\.md)\b")
        missing = []
        for f, text in self.prose.items():
            for m in path.finditer(text):
                p = m.group(1)
                if text[m.end():m.end() + 1] in "<*{$" or re.search(r"/[A-Z]+(\.|/|$)", p):
                    continue  # a pattern (results/<name>/, repro/experiments/NAME.textproto)
                if not self.exists(p, f):
                    missing.append(f"{f}: {p}")
            for m in bare_md.finditer(text):
                if not self.exists(m.group(1), f):
                    missing.append(f"{f}: {m.group(1)}")
        self.assertEqual(missing, [], "paths named in docs and comments that are not in the repository")

    def test_nothing_cites_files_outside_the_repository(self):
        outside = []
        for f, text in self.prose.items():
            for m in re.finditer(r"(?<![\w/.-])((?:\.\./)+[A-Za-z0-9_./-]*[A-Za-z0-9_/])", text):
                target = os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))
                if target.startswith("..") or not self.exists(target, ""):
                    outside.append(f"{f}: {m.group(1)}")
            outside += [f"{f}: {m.group(0)}" for m in re.finditer(r"(?<![\w/.-])shared/(?:design|papers)/\S+", text)]
        self.assertEqual(outside, [], "files cited outside the repository (or missing)")

    def test_every_cited_note_has_one_definition(self):
        defined, cited = {}, {}
        for f, text in self.prose.items():
            flat = re.sub(r"\s+", " ", text)
            for m in re.finditer(r"\[Note: ([^\]]+)\]", flat):
                cited.setdefault(m.group(1), []).append(f)
            for line in text.splitlines():
                m = re.match(r"\s*\[Note: ([^\]]+)\]\s*(\([^)]*\))?\s*$", line)
                if m and not f.endswith(".md"):
                    defined.setdefault(m.group(1), []).append(f)
        undefined = sorted(name for name in cited if name not in defined)
        self.assertEqual(undefined, [], "notes cited but defined nowhere")
        twice = {name: where for name, where in defined.items() if len(where) > 1}
        self.assertEqual(twice, {}, "notes defined more than once")

    def test_no_issue_numbers(self):
        self.maxDiff = None
        found = [f"{f}: {m.group(0)}" for f, text in self.prose.items()
                 for m in re.finditer(r"\b[Ii]ssues? #?\d+", text)]
        self.assertEqual(found, [], "docs are for users: no issue numbers in code or docs")


if __name__ == "__main__":
    unittest.main()
