"""tools/gpu_summary.py on a visit's files written here: every failed test
is named, a skipped benchmark row says why, the 1.3B row's fraction is
judged against the 0.40 bar on either side of it, a breakdown row lists its
shares, each op row shows its rate beside its bound, a missing part is
reported as missing; a test binary that crashed, timed out or was not run
is named though it left no XML; a benchmark file cut short by its limit
gives the rows that finished; and session.sh parses, and with a stand-in
bundle runs its tests and benchmarks, narrows gpt_benchmark's rows and
skips the offload run on request (MEMWALL_BENCH_FILTER;
MEMWALL_OFFLOAD_SECONDS=0: six files, exit 0, the summary says so)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = os.path.join(HERE, "gpu_summary.py")

XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="CudaOps">
<testcase name="Passes" classname="CudaOps" result="completed"/>
<testcase name="NeedsTwoGpus" classname="CudaOps" result="skipped"><skipped message="needs 2 GPUs"/></testcase>
<testcase name="Breaks" classname="CudaOps" result="completed"><failure message="mismatch"/></testcase>
</testsuite></testsuites>"""

XML_PASSED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="CudaOps">
<testcase name="Passes" classname="CudaOps" result="completed"/>
</testsuite></testsuites>"""

# tests.log as session.sh writes it: a start line and an exit line per
# binary, or one line for a binary the visit had no time left for.
TESTS_LOG = """== model_ops_test (0s)
[ RUN      ] CudaOps.Passes
== model_ops_test exit 1
== ops_test (4s)
== ops_test exit 0
== cuda_offload_test (9s)
Segmentation fault
== cuda_offload_test exit 139
== cuda_ranks_test_bin (20s)
== cuda_ranks_test_bin exit 124
== trainer_test not run: the visit's time ran out
"""


def visit(root, fraction, with_offload=True, with_ops=True, cut_ops=False):
    os.makedirs(os.path.join(root, "xml"))
    with open(os.path.join(root, "xml", "model_ops_test.xml"), "w", encoding="utf-8") as handle:
        handle.write(XML)
    with open(os.path.join(root, "tests.log"), "w", encoding="utf-8") as handle:
        handle.write(TESTS_LOG)
    # Names as Google Benchmark writes them for Iterations(3)->UseRealTime().
    rows = [{"name": "BM_GptCuda/gpt_1_3b_bf16/iterations:3/real_time", "iterations": 3, "real_time": 1.0, "tflops": 800 * fraction,
             "gemm_tflops": 800.0, "fraction_of_gemm": fraction, "peak_device_gib": 30.0, "recompute_tflops": 0},
            {"name": "BM_GptCudaBreakdown/gpt_125m_bf16/iterations:3/real_time", "iterations": 3, "real_time": 1.0,
             "attention": 0.25, "linear": 0.6, "unattributed": 0.15},
            {"name": "BM_GptCuda/gpt_125m_fp32/iterations:5/real_time", "error_occurred": True, "error_message": "out of memory"}]
    with open(os.path.join(root, "gpt_benchmark.json"), "w", encoding="utf-8") as handle:
        json.dump({"benchmarks": rows}, handle)
    if with_ops:
        ops_rows = [{"name": "BM_CudaAttention/forward_h16_hd128/iterations:1", "iterations": 1, "real_time": 2.0,
                     "tflops": 250.0, "gemm_tflops": 700.0, "fraction_of_gemm": 250 / 700},
                    {"name": "BM_CudaLayerNorm/backward/iterations:1", "iterations": 1, "real_time": 0.1,
                     "gb_per_s": 1500.0, "copy_gb_per_s": 2600.0, "fraction_of_copy": 1500 / 2600},
                    {"name": "BM_CudaGelu/forward/iterations:1", "error_occurred": True, "error_message": "needs a GPU"}]
        text = json.dumps({"context": {"host_name": "gpu"}, "benchmarks": ops_rows}, indent=2)
        if cut_ops:  # stopped while the third row ran: two rows written, the list never closed
            text = text[:text.index('"name": "BM_CudaGelu')]
            text = text[:text.rindex("{")]
        with open(os.path.join(root, "ops_benchmark.json"), "w", encoding="utf-8") as handle:
            handle.write(text)
    if with_offload:
        with open(os.path.join(root, "offload_dpu_gpu.csv"), "w", encoding="utf-8") as handle:
            handle.write("model,mode,fits,micro_batch,tflops,fraction_of_gemm,device_idle_fraction\n"
                         "gpt_1b,stage2+offload+dpu,yes,8,123.45,0.154,0.31\ngpt_2b,stage0,no,8,,,\n")
    out = subprocess.run([sys.executable, SUMMARY, root, os.path.join(root, "xml"), "9s"],
                         capture_output=True, text=True, check=True)
    return out.stdout


class GpuSummary(unittest.TestCase):
    def test_a_visit(self):
        with tempfile.TemporaryDirectory() as root:
            text = visit(root, 0.41)
        self.assertIn("1 passed, 1 failed, 1 skipped", text)
        self.assertIn("- FAILED model_ops_test: CudaOps.Breaks", text)
        self.assertIn("BM_GptCuda/gpt_1_3b_bf16: 0.410 of the bf16 GEMM rate (meets the 0.40 bar)", text)
        self.assertIn("| BM_GptCuda/gpt_1_3b_bf16 | 328.0 | 800.0 | 0.410 | 30.00 |", text)
        self.assertIn("| BM_GptCuda/gpt_125m_fp32 | skipped: out of memory |", text)
        self.assertIn("linear 60.0%, attention 25.0%, unattributed 15.0%", text)
        self.assertIn("| gpt_1b | stage2+offload+dpu | yes | 8 | 123.5 | 0.154 | 0.31 |", text)
        self.assertIn("| gpt_2b | stage0 | no | 8 |  |  |  |", text)
        self.assertIn("| BM_CudaAttention/forward_h16_hd128 | 250.0 TFLOPS | 700.0 TFLOPS (GEMM) | 0.357 |", text)
        self.assertIn("| BM_CudaLayerNorm/backward | 1500 GB/s | 2600 GB/s (copy) | 0.577 |", text)
        self.assertIn("| BM_CudaGelu/forward | skipped: needs a GPU | | |", text)
        self.assertLess(len(text.splitlines()), 60, "one page")
        # Binaries that left no (or a partial) XML are named by their exits.
        self.assertIn("- EXIT 1 model_ops_test (see tests.log)", text)
        self.assertIn("- EXIT 139 cuda_offload_test (see tests.log)", text)
        self.assertIn("- TIMED OUT cuda_ranks_test_bin (its limit; see tests.log)", text)
        self.assertIn("- NOT RUN trainer_test (the visit's time ran out)", text)
        self.assertNotIn("- EXIT 0 ops_test", text)
        test_section = text[text.index("## gpu tests"):text.index("## GPT")]
        self.assertEqual(len([l for l in test_section.splitlines() if l.startswith("- ")]), 5, "a line per failure")
        self.assertNotIn("cut short", text)

    def test_a_benchmark_cut_short_keeps_its_finished_rows(self):
        with tempfile.TemporaryDirectory() as root:
            text = visit(root, 0.41, cut_ops=True)
        self.assertIn("| BM_CudaAttention/forward_h16_hd128 | 250.0 TFLOPS |", text)
        self.assertIn("| BM_CudaLayerNorm/backward | 1500 GB/s |", text)
        self.assertNotIn("BM_CudaGelu/forward", text)
        self.assertIn("ops_benchmark.json was cut short (its limit): the rows above are the ones that finished", text)

    def test_below_the_bar_and_a_missing_part(self):
        with tempfile.TemporaryDirectory() as root:
            text = visit(root, 0.39, with_offload=False, with_ops=False)
        self.assertIn("0.390 of the bf16 GEMM rate (below the 0.40 bar)", text)
        self.assertIn("offload_dpu_gpu.csv is missing", text)
        self.assertIn("ops_benchmark.json is missing (see benchmarks.log)", text)

    def test_session_script_parses(self):
        subprocess.run(["bash", "-n", os.path.join(HERE, "gpu_session.sh")], check=True)

    def test_a_session_that_skips_the_offload_run(self):
        root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        bundle = os.path.join(root, "bundle")
        os.makedirs(os.path.join(bundle, "bin"))
        shutil.copy(os.path.join(HERE, "gpu_session.sh"), os.path.join(bundle, "session.sh"))
        shutil.copy(SUMMARY, os.path.join(bundle, "gpu_summary.py"))
        with open(os.path.join(bundle, "env.sh"), "w") as f:
            f.write('bin="$here/bin"\n')
        with open(os.path.join(bundle, "MANIFEST"), "w") as f:
            f.write("commit: abc\n")
        stand_ins = {
            # A test binary: gtest's XML where --gtest_output says.
            "ops_test": 'xml="${1#--gtest_output=xml:}"; mkdir -p "$(dirname "$xml")"\n'
                        f"cat > \"$xml\" <<'END'\n{XML_PASSED}\nEND\nexit 0\n",
            # The benchmarks: Google Benchmark's JSON where --benchmark_out says.
            "gpt_benchmark": 'echo "$@" > "$BENCH_ARGS"\n'
                             'for a; do [[ "$a" == --benchmark_out=* ]] && echo \'{"benchmarks": []}\' > "${a#*=}"; done; exit 0\n',
            "ops_benchmark": 'for a; do [[ "$a" == --benchmark_out=* ]] && echo \'{"benchmarks": []}\' > "${a#*=}"; done; exit 0\n',
            "repro_run": "echo ran > \"$OFFLOAD_RAN\"\n",
        }
        for name, body in stand_ins.items():
            path = os.path.join(bundle, "bin", name)
            with open(path, "w") as f:
                f.write("#!/usr/bin/env bash\n" + body)
            os.chmod(path, 0o755)
        os.makedirs(os.path.join(root, "repro", "offload", "dpu"))
        open(os.path.join(root, "repro", "offload", "dpu", "gpu.textproto"), "w").close()
        out = os.path.join(root, "out")
        env = dict(os.environ, MEMWALL_OFFLOAD_SECONDS="0", MEMWALL_SESSION_SECONDS="120",
                   MEMWALL_BENCH_FILTER="BM_GptCuda.*/gpt_1_3b", OFFLOAD_RAN=os.path.join(root, "offload_ran"),
                   BENCH_ARGS=os.path.join(root, "bench_args"))
        done = subprocess.run(["bash", os.path.join(bundle, "session.sh"), out], capture_output=True, text=True,
                              env=env, cwd=root)
        self.assertEqual(done.returncode, 0, "a skipped part is no failure: " + done.stdout + done.stderr)
        self.assertFalse(os.path.exists(os.path.join(root, "offload_ran")), "the offload run was skipped")
        self.assertEqual(sorted(os.listdir(out)), ["benchmarks.log", "gpt_benchmark.json", "machine.txt",
                                                   "ops_benchmark.json", "summary.md", "tests.log"])
        with open(os.path.join(out, "summary.md")) as f:
            summary = f.read()
        self.assertIn("1 passed, 0 failed, 0 skipped", summary)
        self.assertIn("not run: MEMWALL_OFFLOAD_SECONDS=0 (skipped on request)", summary)
        with open(os.path.join(root, "bench_args")) as f:
            self.assertIn("--benchmark_filter=BM_GptCuda.*/gpt_1_3b ", f.read())
        # Without the requests the offload run runs, and every BM_GptCuda row.
        del env["MEMWALL_OFFLOAD_SECONDS"], env["MEMWALL_BENCH_FILTER"]
        subprocess.run(["bash", os.path.join(bundle, "session.sh"), out], capture_output=True, env=env, cwd=root)
        self.assertTrue(os.path.exists(os.path.join(root, "offload_ran")), "the offload run ran")
        with open(os.path.join(root, "bench_args")) as f:
            self.assertIn("--benchmark_filter=BM_GptCuda ", f.read())


if __name__ == "__main__":
    unittest.main()
