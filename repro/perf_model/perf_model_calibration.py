"""//repro:perf_model_calibration: memwall.perf_model against measured steps.

1. The CpuDevice: fits the model's rates (memwall.perf_model.calibrate) to
   the measured steps of results/offload_throughput/ (four ladder GPTs x
   stage 0, ZeRO-2, ZeRO-2 + offload, + DPU), the drive's rates to the fio
   baseline (results/aio/dev_vm/), then predicts the steps of
   results/infinity_prefetch/, results/infinity_activation_offload/ and
   results/infinity_max_model/ (other shapes and micro-batches, ZeRO-3 with
   the parameters, the optimizer and the gradients on the device, the host
   and NVMe), which the fit never saw: their error is the model's held-out
   error on this machine.
2. Each GPU box of BOXES (python/memwall/hardware/<box>.json: one H100
   80GB or one H200, each with a 16-core host): fits its rates
   (memwall.perf_model.calibrate_device) to its measured steps and predicts
   the ones the fit never saw. The fit is the first of the box's `fit`
   results that exists (the whole offload_throughput figure, else its
   headline subset), and every other of its results is held out; where
   only one result exists, its smallest model is the fit and the others
   are held out. The compute rate and h0 come from the stage-0 rows, with
   gpt_benchmark's forward and backward passes measured on the same kind
   of GPU (results/models/<gpu>/<commit>/, the commit of the box's
   `passes_of` result's provenance). Its nvme_gbps comes from the box's
   NVMe walk once that has run. Writes each fitted file beside the results
   (<box>.json), which the committed one must equal.
3. The V100 DGX-2 (python/memwall/hardware/v100_dgx2.json): sets the
   host's bandwidth from ZeRO-Offload Table 4's CPU-Adam time for the 10B,
   then fits compute_efficiency and half_hidden to two points of
   ZeRO-Offload Figure 8 (PyTorch 1.4B at 30 TFLOPS, ZeRO-Offload 10B at 40 TFLOPS on
   one GPU) and sets them beside the file's.

Writes results/perf_model_calibration/{data.csv, calibration.csv,
<box>.json, figure.png, provenance.json}.
"""
import argparse
import csv
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import memwall
from memwall import perf_model

NAME = "perf_model_calibration"
# Results as (folder under results/, the experiment's name under repro/).
TRAIN = (("offload_throughput", "offload_throughput"),)
HELD_OUT = tuple((n, n) for n in ("infinity_prefetch", "infinity_activation_offload", "infinity_max_model"))


@dataclasses.dataclass(frozen=True)
class Box:
    """A GPU box the model is fitted to. Results are (folder under results/,
    the experiment's name under repro/) pairs: the experiments are named
    for the H100 box whose budgets they keep, whichever GPU ran them."""
    name: str      # python/memwall/hardware/<name>.json
    gpu: str       # results/models/<gpu>/<commit>/: gpt_benchmark's passes
    title: str     # the figure's panel
    describe: str  # the hardware file's source, before what was fitted
    fit: tuple     # the first of these with a data.csv is the fit
    held_out: tuple
    passes_of: str  # the result whose provenance commit names the passes
    nvme: tuple    # the box's NVMe walk (its largest model sets nvme_gbps)


BOXES = (
    Box(name="h100_box", gpu="h100", title="H100 box (one GPU)",
        describe="One H100 80GB HBM3 (989 TFLOPS dense bf16, 3.35 TB/s) with a 16-core Xeon host and 128 GiB, as "
                 "lent for GPU runs (results/offload_dpu_gpu/provenance.json)",
        fit=(("offload_throughput/h100", "offload_throughput_h100"),
             ("offload_throughput/h100_headline", "offload_throughput_h100_headline")),
        held_out=(("offload_dpu_gpu", "offload_dpu_gpu"),), passes_of="offload_dpu_gpu",
        nvme=("offload_max_model/h100_nvme", "offload_max_model_h100_nvme")),
    Box(name="h200_box", gpu="h200", title="H200 box (one GPU)",
        describe="One H200 141GB HBM3e (989 TFLOPS dense bf16, 4.8 TB/s) with a 16-core Xeon host and 125.9 GiB, "
                 "as lent for GPU runs (results/offload_throughput/h200/provenance.json)",
        fit=(("offload_throughput/h200", "offload_throughput_h100"),
             ("offload_throughput/h200_headline", "offload_throughput_h100_headline")),
        held_out=(), passes_of="offload_throughput/h200",
        nvme=("offload_max_model/h200_nvme", "offload_max_model_h100_nvme")),
)
PAPERS = "models/configs/papers.textproto"
GPTS = "models/configs/gpt.textproto"
# BM_GptCuda/<config>_bf16[_ckpt] (models/gpt_benchmark.cc): forward and
# backward at micro-batch 8, sequence 1024; "gpt_1_3b" is gpt_1.3b.
GPT_BENCHMARK = re.compile(r"^BM_GptCuda/(gpt_\w+?)_bf16(_ckpt)?/")
GPT_BENCHMARK_BATCH, GPT_BENCHMARK_SEQ = 8, 1024
# ZeRO-Offload Figure 8 (the paper's numbers): one V100.
# Micro-batch 0: the largest that fits (the paper does not give PyTorch's).
V100_POINTS = (("zero_dp_1.5b", dict(stage=0, micro_batch=0), 30.0,
                "PyTorch DDP 1.4B (ZeRO's 34 x 1920 1.5B shape), 30 TFLOPS"),
               ("offload_10b", dict(stage=2, offload_optimizer="cpu", micro_batch=10), 40.0,
                "ZeRO-Offload 10B (50 x 4096, Table 3's b10), 40 TFLOPS"))
# ZeRO-Offload Table 4: the CPU Adam's step for the 10B on the DGX-2's host,
# which sets the V100 file's cpu_memory_gbps at 28 bytes per parameter.
V100_CPU_ADAM = ("offload_10b", 2.57, "ZeRO-Offload Table 4: CPU-Adam 10B 2.57 s")
MODES = {
    "stage0": dict(stage=0),
    "stage2": dict(stage=2),
    "stage2+offload": dict(stage=2, offload_optimizer="cpu"),
    "stage2+offload+dpu": dict(stage=2, offload_optimizer="cpu", dpu=True),
    "stage3": dict(stage=3),
    "stage3+offload": dict(stage=3, offload_optimizer="cpu"),
    "stage3+nvme": dict(stage=3, offload_optimizer="nvme"),
    "stage3+offload+params": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
    "stage3+nvme+params": dict(stage=3, offload_optimizer="nvme", offload_param="cpu"),
    "stage3+nvme+nvme-params": dict(stage=3, offload_optimizer="nvme", offload_param="nvme"),
    "stage3+nvme-all": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", gradients_on_nvme=True),
    "stage3+nvme+nvme-params+prefetch": dict(stage=3, offload_optimizer="nvme", offload_param="nvme"),
    "stage3+offload+params+activation-offload": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
}
# INFINITY_PREFETCH runs each mode without prefetch (prefetch_bucket_bytes
# 0), then with it under the mode's name + "+prefetch"
# (repro/infinity/prefetch/prefetch.cc); every other experiment prefetches.
PREFETCH_SUFFIX = {"INFINITY_PREFETCH": "+prefetch"}


def experiment(workspace, name):
    """The experiment's kind, sequence, micro-batch, ladder, reduce bucket
    (None: the trainer's) and whether its DPU keeps its result on the
    device, from the text proto under repro/ whose name is `name`
    (results/<name>/)."""
    for path in sorted(glob.glob(os.path.join(workspace, "repro", "**", "*.textproto"), recursive=True)):
        with open(path) as f:
            text = f.read()
        if re.search(r'^name:\s*"%s"' % re.escape(name), text, re.M):
            break
    else:
        raise ValueError(f"no experiment under repro/ is named {name}")
    kind = re.search(r"^kind:\s*(\w+)", text, re.M).group(1)
    seq = int(re.search(r"\bseq:\s*(\d+)", text).group(1))
    micro_batch = int(re.search(r"\bmicro_batch:\s*(\d+)", text).group(1))
    bucket = re.search(r"\breduce_bucket_bytes:\s*(\d+)", text)
    ladder = {}
    for body in re.findall(r"ladder\s*\{(.*?)\}", text, re.S):
        model_name = re.search(r'name:\s*"([^"]+)"', body).group(1)
        fields = " ".join(f"{k}: {v}" for k, v in re.findall(r"\b(layers|hidden|heads|vocab|positions|"
                                                              r"activation_checkpointing):\s*(\w+)", body))
        ladder[model_name] = f'name: "{model_name}" {fields}'
    values_on_device = re.search(r"^\s*dpu_values_on_device:\s*true", text, re.M) is not None
    return kind, seq, micro_batch, ladder, int(bucket.group(1)) if bucket else None, values_on_device


def zones(breakdown):
    out = {}
    for part in breakdown.split(", "):
        m = re.match(r"^(.*?) ([0-9.]+)(?: @ .*)?$", part.strip())
        if m:
            out[m.group(1).replace(" (delayed)", "")] = float(m.group(2))
    return out


def measured_rows(workspace, results, split):
    """The trained rows of each (folder, experiment) of `results` as Runs
    with their measured step and zones."""
    rows = []
    for folder, name in results:
        kind, seq, micro_batch, ladder, bucket, values_on_device = experiment(workspace, name)
        with open(os.path.join(workspace, "results", folder, "data.csv")) as f:
            for r in csv.DictReader(f):
                if r["fits"] != "yes":
                    continue
                # The row's own micro-batch where data.csv has the column
                # (a per-model or halved one), else the experiment's.
                if r["mode"] not in MODES:
                    raise ValueError(f"{folder}: mode '{r['mode']}' has no Run here (MODES)")
                mode = dict(MODES[r["mode"]])
                if kind in PREFETCH_SUFFIX and not r["mode"].endswith(PREFETCH_SUFFIX[kind]):
                    mode["prefetch"] = False
                if mode.get("dpu"):
                    mode["dpu_values_on_device"] = values_on_device
                run = perf_model.Run(model=ladder[r["model"]], micro_batch=int(r.get("micro_batch") or micro_batch),
                                     seq=seq, reduce_bucket_bytes=bucket, **mode)
                if perf_model._params(run.model) != int(r["params"]):
                    raise ValueError(f"{folder}/{r['model']}: the model counts {perf_model._params(run.model)} "
                                     f"parameters, the run {r['params']}")
                rows.append(dict(experiment=folder, model=r["model"], mode=r["mode"], run=run, split=split,
                                 measured=float(r["step_seconds"]), zones=zones(r["breakdown"]),
                                 delayed=r["mode"].endswith("+dpu")))
    return rows


def box_rows(workspace, box):
    """The box's (fit, held-out) measured steps: the first of box.fit with
    results fits and every other result of the box is held out; where the
    box has one result, its smallest model fits and its others are held
    out."""
    have = [r for r in box.fit + box.held_out if os.path.exists(os.path.join(workspace, "results", r[0], "data.csv"))]
    if not have:
        raise ValueError(f"{box.name}: none of its results has a data.csv ({', '.join(r[0] for r in box.fit + box.held_out)})")
    if len(have) >= 2:
        return measured_rows(workspace, have[:1], "fit"), measured_rows(workspace, have[1:], "held-out")
    rows = measured_rows(workspace, have, "fit")
    smallest = min(perf_model._params(r["run"].model) for r in rows)
    fit = [r for r in rows if perf_model._params(r["run"].model) == smallest]
    held = [dict(r, split="held-out") for r in rows if perf_model._params(r["run"].model) != smallest]
    return fit, held


def benchmark_rows(workspace, box):
    """gpt_benchmark's bf16 forward and backward passes on the box's GPU,
    from the build that measured box.passes_of (its provenance's commit),
    as rows with a forward+backward zone only; none where that folder is
    missing."""
    with open(os.path.join(workspace, "results", box.passes_of, "provenance.json")) as f:
        commit = json.load(f)["commit"][:7]
    path = os.path.join(workspace, "results", "models", box.gpu, commit, "gpt_benchmark.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        benchmarks = json.load(f)["benchmarks"]
    rows = []
    for b in benchmarks:
        m = GPT_BENCHMARK.match(b["name"])
        if not m or b.get("error_occurred") or b["time_unit"] != "ms":
            continue
        name = m.group(1).replace("_1_3b", "_1.3b")
        run = perf_model.Run(model=memwall.model_config(os.path.join(workspace, GPTS), name),
                             micro_batch=GPT_BENCHMARK_BATCH, seq=GPT_BENCHMARK_SEQ, checkpointing=bool(m.group(2)))
        rows.append(dict(experiment="gpt_benchmark", model=name + (m.group(2) or ""), mode="stage0", run=run,
                         split="fit", measured=b["real_time"] / 1e3,
                         zones={perf_model.FORWARD_BACKWARD: b["real_time"] / 1e3}, delayed=False))
    return rows


def copy_gbps(rows, zone, delayed_only=False):
    """A copy direction's bandwidth over the rows' zones (2 bytes per
    parameter), or None."""
    pairs = [(2 * perf_model._params(r["run"].model), r["zones"][zone]) for r in rows
             if zone in r["zones"] and (r["delayed"] or not delayed_only)]
    return perf_model.bytes_per_second(pairs, zone) / 1e9 if pairs else None


def fio_gbps(workspace, write):
    """The fio baseline's best read (write=False) or write bandwidth on this
    machine (results/aio/dev_vm)."""
    with open(os.path.join(workspace, "results", "aio", "dev_vm", "aio_benchmark.json")) as f:
        runs = json.load(f)["benchmarks"]
    return max(b["fio_GBps"] for b in runs if f"write:{int(write)}/" in b["name"])


def nvme_gbps_of(rows):
    """The NVMe rate perf_model charges (NVME_OPTIMIZER_BYTES_PER_PARAM a
    parameter read in while as many go out, the CPU Adam pipelined beneath)
    as a max-model walk's largest trained model measured it: those bytes
    over its last step's optimizer zone (cpu_adam: the swap waits are inside
    it), in GB/s, both ways; None when no row trained with that zone."""
    trained = [r for r in rows if r["fits"] == "yes" and "cpu_adam" in zones(r.get("breakdown", ""))]
    if not trained:
        return None
    r = max(trained, key=lambda r: int(r["params"]))
    return perf_model.NVME_OPTIMIZER_BYTES_PER_PARAM * int(r["params"]) / zones(r["breakdown"])["cpu_adam"] / 1e9


def box_nvme_gbps(workspace, box):
    """nvme_gbps_of the box's NVMe walk (repro/offload/max_model/
    h100_nvme.textproto: its largest model's last step), or None while it
    has not run."""
    path = os.path.join(workspace, "results", box.nvme[0], "data.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return nvme_gbps_of(list(csv.DictReader(f)))


def v100_cpu_gbps():
    """The host bandwidth at which the CPU Adam takes V100_CPU_ADAM's time."""
    name, seconds, _ = V100_CPU_ADAM
    return perf_model.CPU_ADAM_BYTES_PER_PARAM * perf_model._params(memwall.model_config(PAPERS, name)) / seconds / 1e9


def fit_v100(hw):
    """compute_efficiency and half_hidden that put V100_POINTS on their TFLOPS
    (with the CPU Adam at v100_cpu_gbps()):
    for each h0 on a grid, the efficiency that hits the first point
    (bisection; TFLOPS rise with it; an h0 no efficiency up to 1 can is
    skipped), then the h0 that best hits the second."""
    hw = dataclasses.replace(hw, cpu_memory_gbps=v100_cpu_gbps())
    runs = []
    for name, mode, tflops, _ in V100_POINTS:
        model = memwall.model_config(PAPERS, name)
        run = perf_model.Run(model=model, ranks=1, **mode)
        if run.micro_batch == 0:
            run = dataclasses.replace(run, micro_batch=perf_model.largest_micro_batch(run, hw))
        runs.append((run, tflops))

    def tflops(h0, eff, run):
        return perf_model.predict(run, dataclasses.replace(hw, half_hidden=h0, compute_efficiency=eff),
                                  with_memory=False).tflops_per_device

    best = None
    for h0 in range(0, 8001, 25):
        if tflops(h0, 1.0, runs[0][0]) < runs[0][1]:
            continue  # no efficiency up to 1 reaches the first point
        lo, hi = 0.01, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tflops(h0, mid, runs[0][0]) < runs[0][1] else (lo, mid)
        err = abs(tflops(h0, lo, runs[1][0]) - runs[1][1])
        if best is None or err < best[0]:
            best = (err, h0, lo)
    return best[1], best[2], runs


def fit_box(workspace, box):
    """The box's fitted hardware and its (fit, held-out) rows, with what
    calibration.csv says of them."""
    fit, held = box_rows(workspace, box)
    passes = benchmark_rows(workspace, box)  # the compute fit's other hidden sizes; not steps
    hw = perf_model.calibrate_device(fit + passes, perf_model.load_hardware(box.name), box.name)
    nvme = box_nvme_gbps(workspace, box)
    if nvme is not None:
        hw = dataclasses.replace(hw, nvme_gbps=nvme)
    steps = sorted({r["experiment"] for r in fit})  # measured steps, not passes alone
    experiments = sorted({r["experiment"] for r in fit + passes})
    one_hidden = len({perf_model._field(r["run"].model, "hidden") for r in fit + passes}) == 1
    fitted = [f for f in perf_model.DEVICE_FITTED_FIELDS if not (one_hidden and f == "half_hidden")]
    hw = dataclasses.replace(hw, source=(
        f"{box.describe}. Fitted by //repro:perf_model_calibration to the measured steps of {', '.join(steps)}"
        + (f" and gpt_benchmark's forward and backward passes in results/models/{box.gpu}/" if passes else "")
        + " (results/perf_model_calibration/): "
        f"{', '.join(fitted)}" + ("; half_hidden is the file's (the steps span one hidden size)" if one_hidden else "")
        + (f"; nvme_gbps from {box.nvme[0]}'s largest model (12 bytes a parameter each way over its optimizer zone)"
           if nvme is not None else "")
        + ". The rest is the datasheet's" + ("" if nvme is not None else "; nvme_gbps is assumed, not measured")
        + "; intra_node_gbps and inter_node_gbps are unused on one GPU."))
    notes = [(field, f"{getattr(hw, field):.6g}", "fitted to " + "+".join(experiments))
             for field in perf_model.DEVICE_FITTED_FIELDS]
    notes.append(("nvme_gbps", f"{hw.nvme_gbps:.6g}",
                  f"measured in {box.nvme[0]}" if nvme is not None else "assumed (the NVMe walk has not run)"))
    for what, gbps in (("pcie d2h gbps (gradients down)", copy_gbps(fit, perf_model.GRAD_D2H)),
                       ("pcie h2d gbps (the delayed update's parameters up)",
                        copy_gbps(fit, perf_model.PARAM_H2D, delayed_only=True))):
        if gbps is not None:
            notes.append((what, f"{gbps:.4g}", "measured in " + "+".join(steps)))
    return hw, fit, held, experiments, notes


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results_dir", default="",
                    help="default: <workspace>/out/results (--results_dir=results for the tracked results/)")
    args = ap.parse_args(argv)
    workspace = memwall.workspace_dir()
    results_dir = memwall.user_path(args.results_dir)
    out = os.path.join(results_dir or os.path.join(workspace, "out", "results"), NAME)
    os.makedirs(out, exist_ok=True)

    train = measured_rows(workspace, TRAIN, "fit")
    held = measured_rows(workspace, HELD_OUT, "held-out")
    hw = perf_model.calibrate(train, nvme_gbps=fio_gbps(workspace, write=False),
                              nvme_write_gbps=fio_gbps(workspace, write=True), name="dev_vm")
    machines = [("dev_vm", hw, train + held)]
    boxes = []
    for box in BOXES:
        box_hw, fit, box_held, experiments, notes = fit_box(workspace, box)
        machines.append((box.name, box_hw, fit + box_held))
        boxes.append((box, box_hw, experiments, notes))
    rows = []
    for machine, hardware, group in machines:
        for r in group:
            p = perf_model.predict(r["run"], hardware, with_memory=False)
            rows.append(dict(r, machine=machine, predicted=p.step_seconds, error=p.step_seconds / r["measured"] - 1))
    with open(os.path.join(out, "data.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["machine", "experiment", "model", "mode", "split", "params", "micro_batch", "measured_step_seconds",
                    "predicted_step_seconds", "relative_error", "source"])
        for r in rows:
            w.writerow([r["machine"], r["experiment"], r["model"], r["mode"], r["split"],
                        perf_model._params(r["run"].model), r["run"].micro_batch, f"{r['measured']:.4f}",
                        f"{r['predicted']:.4f}", f"{r['error']:+.4f}", "measured,modeled"])
    for box, box_hw, _, _ in boxes:
        with open(os.path.join(out, box.name + ".json"), "w") as f:
            json.dump(dataclasses.asdict(box_hw), f, indent=2)
            f.write("\n")

    def summary(split, machine="dev_vm"):
        """(steps, mean |error|, max |error|) of a split; (0, None, None)
        where it has no steps."""
        errs = [abs(r["error"]) for r in rows if r["split"] == split and r["machine"] == machine]
        return (len(errs), sum(errs) / len(errs), max(errs)) if errs else (0, None, None)

    def summary_rows(w, machine):
        for split in ("fit", "held-out"):
            n, mean, worst = summary(split, machine)
            if n:
                w.writerow([machine, f"{split} mean |error|", f"{mean:.4f}", f"{n} steps"])
                w.writerow([machine, f"{split} max |error|", f"{worst:.4f}", f"{n} steps"])

    v100 = perf_model.load_hardware("v100_dgx2")
    h0, eff, v100_runs = fit_v100(v100)
    with open(os.path.join(out, "calibration.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["machine", "quantity", "value", "how"])
        for field in ("device_tflops", "half_hidden", "device_memory_gbps", "cpu_memory_gbps",
                      "host_bytes_per_param", "pcie_gbps", "nvme_gbps", "nvme_write_gbps"):
            fio = {"nvme_gbps": "fio read, results/aio/dev_vm", "nvme_write_gbps": "fio write, results/aio/dev_vm"}
            w.writerow(["dev_vm", field, f"{getattr(hw, field):.6g}",
                        fio.get(field, "fitted to " + "+".join(r[0] for r in TRAIN))])
        summary_rows(w, "dev_vm")
        for box, _, _, notes in boxes:
            for quantity, value, how in notes:
                w.writerow([box.name, quantity, value, how])
            summary_rows(w, box.name)
        for field, value, how in (("cpu_memory_gbps", v100_cpu_gbps(), V100_CPU_ADAM[2] + " at 28 bytes a parameter"),
                                  ("compute_efficiency", eff, "fitted to ZeRO-Offload Figure 8"),
                                  ("half_hidden", h0, "fitted to ZeRO-Offload Figure 8")):
            w.writerow(["v100_dgx2", field, f"{value:.4g}", how])
            w.writerow(["v100_dgx2", field + " (hardware file)", f"{getattr(v100, field):.4g}",
                        "python/memwall/hardware/v100_dgx2.json"])
        for (name, _, tflops, what), (run, _) in zip(V100_POINTS, v100_runs):
            got = perf_model.predict(run, v100, with_memory=False).tflops_per_device
            w.writerow(["v100_dgx2", f"{name} b{run.micro_batch} TFLOPS (file / paper)", f"{got:.2f} / {tflops}", what])
    for machine, _, _ in machines:
        for split in ("fit", "held-out"):
            n, mean, worst = summary(split, machine)
            if n:
                print(f"{machine} {split}: {n} steps, mean |error| {mean:.1%}, max {worst:.1%}")
    print(f"v100_dgx2: cpu_memory_gbps {v100_cpu_gbps():.4g} (Table 4), fitted compute_efficiency {eff:.4f}, "
          f"half_hidden {h0} (file: {v100.cpu_memory_gbps}, {v100.compute_efficiency}, {v100.half_hidden})")

    titles = {box.name: box.title for box in BOXES}
    subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "figure.py"), out,
                    json.dumps(titles)], check=True)
    box_files = {box.name + ".json": f"{box.name}'s hardware file as fitted (python/memwall/hardware/ holds a copy)"
                 for box in BOXES}
    memwall.write_provenance(
        os.path.join(out, "provenance.json"), experiment=NAME,
        description="memwall.perf_model fitted to CpuDevice steps of offload_throughput and checked on the held-out "
                    f"steps of {', '.join(r[0] for r in HELD_OUT)}; fitted to each GPU box's steps ("
                    + "; ".join(f"{box.name}: {', '.join(experiments)}" for box, _, experiments, _ in boxes)
                    + ") and checked on its held-out ones; the V100's compute constants fitted to ZeRO-Offload Figure 8",
        paper="ZeRO (SC20), ZeRO-Offload (ATC21), ZeRO-Infinity (SC21): the performance model behind the modeled "
              "figures",
        command="./bazelw run //repro:%s -- %s" % (NAME, " ".join(shlex.quote(a) for a in argv)),
        measured_or_modeled="measured_step_seconds: results/<experiment>/data.csv, measured on the CpuDevice (dev_vm) "
                            "or a GPU box (" + ", ".join(box.name for box in BOXES) + "; see their provenance); "
                            "predicted_step_seconds: modeled (memwall.perf_model)",
        files=dict({"data.csv": "per measured step: machine, measured and predicted seconds, relative error, fit or "
                                "held-out",
                    "calibration.csv": "fitted constants and the error summary"},
                   **box_files, **{"figure.png": "drawn by repro/perf_model/figure.py from data.csv"}))
    print(f"wrote {out}/{{data.csv, calibration.csv, " + ", ".join(sorted(box_files))
          + ", figure.png, provenance.json}")


if __name__ == "__main__":
    main(sys.argv[1:])
