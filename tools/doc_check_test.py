"""Docs that cannot drift: over every README, doc and comment in the tree,
  - every repository path named (zero/trainer.h, docs/reliability.md,
    results/fuzz/) exists, as does every bare *.md name beside its file;
  - nothing cites a file outside the repository (a ../ path, or the
    design notes' folder anywhere in any file);
  - every [Note: X] cited has exactly one definition (a comment line that
    holds it alone, or with a parenthetical: "// [Note: X] (ZeRO §5.1)");
  - no code or doc carries issue numbers: docs are for users;
  - every paper section cited ("ZeRO §5.2", a bare "§6.1" in a paper's
    package) is in docs/papers.md's outline of that paper, and a figure or
    table cited beside it ("§8.5, Figure 6a") belongs to that section;
  - the layers of docs/architecture.md hold: no library file includes (or,
    in Python, imports) a package listed below its own; tests, fuzzers and
    benchmarks are users, and may enter through any layer.
The files come from each package's :doc_sources (every file it holds)."""
import os
import re
import unittest

TEXT = re.compile(r"\.(md|cc|h|py|sh|proto|bzl|cu|cuh|textproto)$|(^|/)BUILD$|^\.ci/run$|^bazelw$|/provenance\.json$")
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
    """The prose of a file: all of a Markdown file or a result's provenance,
    the comments of code."""
    if path.endswith((".md", ".json")):
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
                    continue  # a pattern (results/<name>/, repro/<paper>/<result>/)
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
        self.assertEqual(outside, [], "files cited outside the repository (or missing)")

    def test_no_file_names_the_design_folder(self):
        # Anywhere in any file, strings and data included (a corpus, a
        # provenance note, WORKSPACE): the design notes are not shipped.
        outside = []
        for f in self.files:
            if f.endswith(".png") or f == "tools/doc_check_test.py":
                continue
            with open(f, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            outside += [f"{f}: {m.group(0)}" for m in re.finditer(r"(?<![\w.-])shared/(?:design|papers)/\S+", text)]
        self.assertEqual(outside, [], "files that name the design notes, which are not in the repository")

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


# A paper's name in prose, and the paper it names.
PAPER_NAMES = re.compile(r"ZeRO-Offload|ZeRO-Infinity|ZeRO-R\b|ZeRO-DP\b|ZeRO(?![-\w])|ATC21|SC21|SC20")
PAPER_OF_NAME = {"ZeRO-Offload": "ZeRO-Offload", "ATC21": "ZeRO-Offload", "ZeRO-Infinity": "ZeRO-Infinity",
                 "SC21": "ZeRO-Infinity", "ZeRO": "ZeRO", "ZeRO-R": "ZeRO", "ZeRO-DP": "ZeRO", "SC20": "ZeRO"}
# The paper a package's bare "§N" means (its README maps that paper to files).
PAPER_OF_PACKAGE = {"zero": "ZeRO", "offload": "ZeRO-Offload", "cpu_adam": "ZeRO-Offload",
                    "infinity": "ZeRO-Infinity"}
SECTION = re.compile(r"§(\d+(?:\.\d+)*)(?:,? *(?:and|\(?)? *(Figure|Fig\.|Table)s? ?(\d+[a-e]?))?")


def outlines():
    """docs/papers.md: {paper: {section: [figures and tables]}}."""
    with open("docs/papers.md", encoding="utf-8") as handle:
        text = handle.read()
    result = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        paper = block.split()[0]
        sections = {}
        for m in re.finditer(r"^\| (\d+(?:\.\d+)*) \| [^|]+ \|([^|\n]*)\|", block, re.M):
            sections[m.group(1)] = [f.strip() for f in m.group(2).split(",") if f.strip()]
        result[paper] = sections
    return result


class PaperSections(unittest.TestCase):
    def test_every_cited_section_is_in_the_papers_outline(self):
        papers = outlines()
        self.assertEqual(sorted(papers), ["ZeRO", "ZeRO-Infinity", "ZeRO-Offload"])
        self.assertIn("Figure 2", papers["ZeRO"]["10.2"])
        prose = DocCheck.prose if hasattr(DocCheck, "prose") else None
        if prose is None:
            DocCheck.setUpClass()
            prose = DocCheck.prose
        unknown, misplaced, cited = [], [], 0
        for f, text in prose.items():
            if f == "docs/papers.md" or f.startswith("results/"):
                continue
            package_paper = PAPER_OF_PACKAGE.get(f.split("/")[0])
            lines = text.splitlines()
            for i, line in enumerate(lines):
                for m in SECTION.finditer(line):
                    # The paper named last before it on its line, or at the
                    # end of the line before when the citation opens its line.
                    before = line[:m.start()]
                    if not before.strip(" (|*-") and i > 0:
                        before = lines[i - 1][-30:]
                    names = [n for n in PAPER_NAMES.finditer(before)]
                    paper = PAPER_OF_NAME[names[-1].group(0)] if names else package_paper
                    if paper is None:
                        continue  # a § of something else
                    cited += 1
                    section = m.group(1)
                    if section not in papers[paper]:
                        unknown.append(f"{f}: {paper} §{section}")
                        continue
                    if m.group(2):
                        kind = "Table" if m.group(2) == "Table" else "Figure"
                        exact, whole = f"{kind} {m.group(3)}", f"{kind} {m.group(3).rstrip('abcde')}"
                        branch = [s for s in papers[paper]
                                  if s == section or section.startswith(s + ".") or s.startswith(section + ".")]
                        if not any(exact in papers[paper][s] or whole in papers[paper][s] for s in branch):
                            misplaced.append(f"{f}: {paper} §{section}, {exact}")
        self.assertGreater(cited, 100)
        self.maxDiff = None
        self.assertEqual(unknown, [], "sections cited that docs/papers.md's outline of the paper does not have")
        self.assertEqual(misplaced, [], "figures or tables cited beside a section that does not present them")


# Test code: tests, their helpers and victims, fuzzers, benchmarks.
TEST_CODE = re.compile(r"(_test|_fuzzer|_benchmark|_victim)\.(cc|h|py|sh)$|(^|/)testing\.h$|_test_\w+\.cc$")


def layers():
    """The packages of docs/architecture.md's "Layers" block, top first."""
    with open("docs/architecture.md", encoding="utf-8") as handle:
        text = handle.read()
    block = re.search(r"## Layers\n.*?```\n(.*?)```", text, re.S).group(1)
    return [m.group(1) for m in re.finditer(r"^(\w+)/\s", block, re.M)]


class Layers(unittest.TestCase):
    def test_no_include_or_import_runs_up_the_layers(self):
        order = layers()
        self.assertGreater(len(order), 5, "docs/architecture.md lists the layers")
        rank = {package: i for i, package in enumerate(order)}
        python = rank["python"]
        upward, library_files = [], 0
        for f in DocCheck.files if hasattr(DocCheck, "files") else repository_files():
            package = f.split("/")[0]
            if package not in rank or TEST_CODE.search(f) or not re.search(r"\.(cc|h|cu|cuh|py)$", f):
                continue
            library_files += 1
            with open(f, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            for m in re.finditer(r'^#include "(\w+)/', text, re.M):
                if m.group(1) in rank and rank[m.group(1)] > rank[package]:
                    upward.append(f"{f}: includes {m.group(1)}/")
            if f.endswith(".py") and rank[package] < python and re.search(r"^\s*(import|from) memwall\b", text, re.M):
                upward.append(f"{f}: imports memwall (python/)")
        self.assertGreater(library_files, 100)
        self.assertEqual(upward, [], "includes that run up the layers of docs/architecture.md")

    def test_every_package_with_code_is_a_layer(self):
        order = set(layers())
        code = {f.split("/")[0] for f in repository_files() if "/" in f and re.search(r"\.(cc|h|cu)$", f)}
        self.assertEqual(sorted(code - order - {"tools", "third_party"}), [],
                         "packages with code that docs/architecture.md does not place in a layer")


if __name__ == "__main__":
    unittest.main()
