"""The one-page summary of a GPU visit (tools/gpu_session.sh), in Markdown.

  python3 gpu_summary.py RESULTS_DIR XML_DIR ELAPSED

Reads RESULTS_DIR/machine.txt, the tests' JUnit XML in XML_DIR and their
exit codes in RESULTS_DIR/tests.log, RESULTS_DIR/gpt_benchmark.json,
RESULTS_DIR/ops_benchmark.json and RESULTS_DIR/offload_dpu_gpu.csv; a
missing part is reported as missing, never skipped silently, and a test
binary that crashed, timed out or was not run is named even where it left
no XML. Standard library only: the GPU machine has nothing else."""
import re
import csv
import glob
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

# The bar the CUDA GPT is held to: model TFLOPS of the 1.3B GPT (bf16,
# micro-batch 8, no checkpointing) against the bf16 GEMM rate of the same run.
TARGET_ROW = "BM_GptCuda/gpt_1_3b_bf16"
TARGET_FRACTION = 0.40
# Google Benchmark's own fields in a JSON row; every other number is a counter.
BENCHMARK_FIELDS = {"family_index", "per_family_instance_index", "repetitions", "repetition_index",
                    "threads", "iterations", "real_time", "cpu_time"}


def exits(log_path):
    """The test binaries that did not exit 0, from the session's tests.log
    lines "== NAME exit CODE" and "== NAME not run: ..."."""
    if not os.path.exists(log_path):
        return ["tests.log is missing"]
    out = []
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if m := re.match(r"== (\S+) exit (\d+)$", line.rstrip()):
                code = int(m.group(2))
                if code == 124:
                    out.append(f"- TIMED OUT {m.group(1)} (its limit; see tests.log)")
                elif code != 0:
                    out.append(f"- EXIT {code} {m.group(1)} (see tests.log)")
            elif m := re.match(r"== (\S+) (not run: .*)$", line.rstrip()):
                out.append(f"- NOT RUN {m.group(1)} ({m.group(2)[len('not run: '):]})")
    return out


def tests(xml_dir, log_path):
    lines, failed = [], []
    totals = {"run": 0, "failed": 0, "skipped": 0}
    for path in sorted(glob.glob(os.path.join(xml_dir, "*.xml"))):
        try:
            root = ElementTree.parse(path).getroot()
        except ElementTree.ParseError as error:
            failed.append(f"{os.path.basename(path)}: unreadable XML ({error})")
            continue
        for case in root.iter("testcase"):
            name = f"{os.path.basename(path)[:-4]}: {case.get('classname')}.{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                totals["failed"] += 1
                failed.append(name)
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                totals["skipped"] += 1
            else:
                totals["run"] += 1
    lines.append(f"{totals['run']} passed, {totals['failed']} failed, {totals['skipped']} skipped "
                 f"({len(glob.glob(os.path.join(xml_dir, '*.xml')))} XML files; output in tests.log)")
    lines += [f"- FAILED {name}" for name in failed]
    return lines + exits(log_path)


def row_name(name):
    """A row's name without the run settings Google Benchmark appends
    ("/iterations:3", "/real_time")."""
    return "/".join(part for part in name.split("/") if ":" not in part and part != "real_time")


def load_rows(path):
    """A Google Benchmark JSON file's rows, and whether it was cut short: the
    library writes each row as it finishes and closes the list at the end,
    so a run stopped by its limit leaves the finished rows readable."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return json.loads(text).get("benchmarks", []), False
    except json.JSONDecodeError:
        cut = text[:text.rfind("}") + 1] if "}" in text else ""
        try:
            return json.loads(cut + "]}").get("benchmarks", []), True
        except json.JSONDecodeError:
            return [], True


def benchmarks(path):
    if not os.path.exists(path):
        return ["gpt_benchmark.json is missing (see benchmarks.log)"], []
    rows, cut = load_rows(path)
    models = ["| row | TFLOPS | GEMM TFLOPS | fraction | peak GiB |", "| --- | --- | --- | --- | --- |"]
    breakdown = []
    verdict = f"{TARGET_ROW}: not measured"
    for row in rows:
        name = row_name(row.get("name", "?"))
        if row.get("error_occurred"):
            models.append(f"| {name} | skipped: {row.get('error_message', '')} | | | |")
            continue
        if "Breakdown" in name:  # its counters are the kinds' shares of a step
            shares = sorted(((k, v) for k, v in row.items()
                             if k not in BENCHMARK_FIELDS and isinstance(v, (int, float))), key=lambda kv: -kv[1])
            breakdown.append(f"- {name}: " + ", ".join(f"{k} {v:.1%}" for k, v in shares))
            continue
        tflops, gemm, fraction = row.get("tflops", 0), row.get("gemm_tflops", 0), row.get("fraction_of_gemm", 0)
        recompute = row.get("recompute_tflops", 0)
        shown = f"{tflops:.1f}" + (f" (+{recompute:.1f} recompute)" if recompute else "")
        models.append(f"| {name} | {shown} | {gemm:.1f} | {fraction:.3f} | {row.get('peak_device_gib', 0):.2f} |")
        if name == TARGET_ROW:
            ok = fraction >= TARGET_FRACTION
            verdict = (f"{TARGET_ROW}: {fraction:.3f} of the bf16 GEMM rate "
                       f"({'meets' if ok else 'below'} the {TARGET_FRACTION:.2f} bar)")
    if cut:
        models += ["", "gpt_benchmark.json was cut short (its limit): the rows above are the ones that finished"]
    return [verdict, ""] + models, breakdown


def ops(path):
    """Each op alone: its rate beside the bound measured in the same run."""
    if not os.path.exists(path):
        return ["ops_benchmark.json is missing (see benchmarks.log)"]
    rows, cut = load_rows(path)
    lines = ["| op | rate | bound | fraction |", "| --- | --- | --- | --- |"]
    for row in rows:
        name = row_name(row.get("name", "?"))
        if row.get("error_occurred"):
            lines.append(f"| {name} | skipped: {row.get('error_message', '')} | | |")
        elif "tflops" in row:
            lines.append(f"| {name} | {row['tflops']:.1f} TFLOPS | {row.get('gemm_tflops', 0):.1f} TFLOPS (GEMM) "
                         f"| {row.get('fraction_of_gemm', 0):.3f} |")
        else:
            lines.append(f"| {name} | {row.get('gb_per_s', 0):.0f} GB/s | {row.get('copy_gb_per_s', 0):.0f} GB/s (copy) "
                         f"| {row.get('fraction_of_copy', 0):.3f} |")
    if cut:
        lines += ["", "ops_benchmark.json was cut short (its limit): the rows above are the ones that finished"]
    return lines


def offload(path, log):
    if not os.path.exists(path):
        if os.path.exists(log):
            with open(log, encoding="utf-8") as handle:
                skipped = [line.strip() for line in handle if re.match(r"== repro_run \S+ skipped: ", line)]
            if skipped:
                return [f"not run: {skipped[0].split(' skipped: ', 1)[1]} (skipped on request)"]
        return ["offload_dpu_gpu.csv is missing (see benchmarks.log)"]
    with open(path, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    lines = ["| model | mode | fits | micro-batch | TFLOPS | fraction of GEMM | device idle |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        fits = r.get("fits") == "yes"
        cell = lambda key, fmt: format(float(r[key]), fmt) if fits and r.get(key) else ""
        lines.append(f"| {r.get('model')} | {r.get('mode')} | {r.get('fits')} | {r.get('micro_batch', '')} | "
                     f"{cell('tflops', '.1f')} | {cell('fraction_of_gemm', '.3f')} | "
                     f"{cell('device_idle_fraction', '.2f')} |")
    return lines


def main():
    results, xml_dir, elapsed = sys.argv[1], sys.argv[2], sys.argv[3]
    out = [f"# GPU visit ({elapsed})", ""]
    machine = os.path.join(results, "machine.txt")
    if os.path.exists(machine):
        with open(machine, encoding="utf-8") as handle:
            keep = [line.rstrip() for line in handle if not line.startswith("targets:")]
        out += ["```"] + keep + ["```", ""]
    out += ["## gpu tests", ""] + tests(xml_dir, os.path.join(results, "tests.log")) + [""]
    model_lines, breakdown = benchmarks(os.path.join(results, "gpt_benchmark.json"))
    out += ["## GPT forward + backward, sequence 1024 (gpt_benchmark)", ""] + model_lines + [""]
    out += ["## Where a step's time goes (module hooks)", ""] + (breakdown or ["no breakdown row"]) + [""]
    out += ["## Each op alone at the 1.3B GPT's shapes (ops_benchmark)", ""]
    out += ops(os.path.join(results, "ops_benchmark.json")) + [""]
    out += ["## ZeRO-Offload Figure 9 on this GPU (offload_dpu_gpu)", ""]
    out += offload(os.path.join(results, "offload_dpu_gpu.csv"), os.path.join(results, "benchmarks.log"))
    print("\n".join(out))


if __name__ == "__main__":
    main()
