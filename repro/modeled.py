"""The papers' multi-node results, modeled: memwall.perf_model on the V100
DGX-2 (python/memwall/hardware/v100_dgx2.json), memory from memwall.estimate
(the engine's plans), beside the paper's values.

    ./bazelw run //repro:zero_throughput        # ZeRO Figure 2: 1.5B-170B on 400 GPUs, ZeRO-100B vs baseline MP
    ./bazelw run //repro:zero_superlinear       # ZeRO Figure 3: 60B on 64-400 GPUs
    ./bazelw run //repro:zero_dp_only           # ZeRO Figure 4: data parallelism alone on 128 GPUs
    ./bazelw run //repro:offload_dpu            # ZeRO-Offload Figure 9: delayed parameter update
    ./bazelw run //repro:offload_scaling        # ZeRO-Offload Figure 11: 10B on 1-128 GPUs
    ./bazelw run //repro:infinity_efficiency    # ZeRO-Infinity Figure 3: efficiency against bandwidth
    ./bazelw run //repro:infinity_scale         # ZeRO-Infinity Figure 5: 0.5T-20T on 512 GPUs

Each writes results/<name>/{data.csv, figure.png, provenance.json}; a row's
`source` is modeled (with the model's held-out error from
results/perf_model_calibration/) or paper.
"""
import argparse
import csv
import dataclasses
import os
import shlex
import subprocess
import sys

import memwall
from memwall import perf_model

PAPERS = "models/configs/papers.textproto"
BATCHES = (1, 2, 4, 8, 16, 32, 64)  # searched when a Run has micro_batch 0
# ZeRO's and ZeRO-Infinity's figures: sequences per optimizer step, reached
# by gradient accumulation. An assumption: the papers' per-run batch sizes
# are not in the papers' text; 1024 x 1024 tokens is GPT-2 /
# Megatron-era practice.
ZERO_GLOBAL_BATCH = 1024
COLUMNS = ["series", "model", "params", "ranks", "model_parallel", "stage", "offload", "dpu", "micro_batch",
           "accumulation", "fits",
           "step_seconds", "tflops_per_gpu", "total_pflops", "device_bytes_per_rank", "x", "value", "source", "note"]


def model(name):
    return memwall.model_config(PAPERS, name)


def row(series, name, run, hw, note="", global_batch=0, max_micro_batch=64):
    """`run` predicted, at the largest micro-batch of BATCHES that fits when run.micro_batch is 0."""
    if run.micro_batch == 0:
        b = perf_model.largest_micro_batch(dataclasses.replace(run, micro_batch=1), hw,
                                           [x for x in BATCHES if x <= max_micro_batch])
        if b is None:
            mem = perf_model.memory(dataclasses.replace(run, micro_batch=1), hw)
            return dict(series=series, model=name, params=perf_model._params(run.model), ranks=run.ranks,
                        model_parallel=run.model_parallel, stage=run.stage, offload=_offload(run), dpu=int(run.dpu),
                        micro_batch=1, fits="no", device_bytes_per_rank=mem["total_device_bytes_per_rank"],
                        source="modeled", note=note or "does not fit at micro-batch 1")
        run = dataclasses.replace(run, micro_batch=b)
    if global_batch:
        run = dataclasses.replace(run, accumulation=max(1, -(-global_batch // (run.micro_batch * run.data_parallel))))
    p = perf_model.predict(run, hw)
    return dict(series=series, model=name, params=p.params, ranks=run.ranks, model_parallel=run.model_parallel,
                stage=run.stage, offload=_offload(run), dpu=int(run.dpu), micro_batch=run.micro_batch,
                accumulation=run.accumulation, fits="yes" if p.fits else "no", step_seconds=f"{p.step_seconds:.4f}",
                tflops_per_gpu=f"{p.tflops_per_device:.2f}",
                total_pflops=f"{p.tflops_per_device * run.ranks / 1000:.3f}",
                device_bytes_per_rank=p.memory["total_device_bytes_per_rank"], source="modeled", note=note)


def _offload(run):
    parts = [f"optimizer:{run.offload_optimizer}"] if run.offload_optimizer != "none" else []
    if run.offload_param != "none":
        parts.append(f"params:{run.offload_param}")
    return "+".join(parts) or "none"


def smallest_mp(name, hw, ranks, stage, mps=(1, 2, 4, 8, 16, 32, 64)):
    """The smallest model-parallel degree whose micro-batch 1 fits (Megatron's choice), or None."""
    for mp in mps:
        if ranks % mp:
            continue
        run = perf_model.Run(model=model(name), ranks=ranks, model_parallel=mp, stage=stage, micro_batch=1)
        if perf_model.memory(run, hw)["fits"]:
            return mp
    return None


def tiled(run, hw, factors=(1, 2, 4, 8, 16, 32, 64)):
    """`run` with its activation checkpoints offloaded to the host (ZeRO-Infinity
    §5.1.2) and the smallest memory-centric tiling factor (§5.1.3) at which
    micro-batch 1 fits, and that factor (the last tried when none does)."""
    for t in factors:
        tiled_run = dataclasses.replace(run, model=f"{run.model} offload_activations: true tiling: {t}")
        if perf_model.memory(dataclasses.replace(tiled_run, micro_batch=1), hw)["fits"]:
            return tiled_run, t
    return tiled_run, t


def paper(series, name, x, value, note):
    return dict(series=series, model=name, x=x, value=value, source="paper", note=note)


def zero_throughput(hw):
    """ZeRO Figure 2: 400 V100s; ZeRO-100B (P_os+g with ZeRO-R's partitioned
    activation checkpoints, MP within a node) against the baseline (Megatron
    MP, stage 0), each at its smallest fitting MP."""
    rows = []
    for name in ("zero_1.5b", "zero_8b", "zero_20b", "zero_40b", "zero_60b", "zero_80b", "zero_100b", "zero_120b",
                 "zero_140b", "zero_170b"):
        for series, stage, mps in (("ZeRO-100B (stage 2)", 2, (1, 2, 4, 8, 16)),
                                   ("baseline Megatron MP (stage 0)", 0, (1, 2, 4, 8, 16, 32, 64))):
            ranks = 400
            mp = None
            for m in mps:
                r = ranks - ranks % m
                if perf_model.memory(perf_model.Run(model=model(name), ranks=r, model_parallel=m, stage=stage,
                                                    micro_batch=1), hw)["fits"]:
                    mp, ranks = m, r
                    break
            if mp is None:
                rows.append(dict(series=series, model=name, ranks=ranks, stage=stage, fits="no", source="modeled",
                                 note=f"no MP degree of {mps} fits"))
                continue
            run = perf_model.Run(model=model(name), ranks=ranks, model_parallel=mp, stage=stage, micro_batch=0,
                                 partition_activations=stage == 2)
            rows.append(row(series, name, run, hw, note=f"smallest fitting MP {mp}", global_batch=ZERO_GLOBAL_BATCH))
    rows.append(paper("ZeRO-100B (stage 2)", "zero_100b", 100e9, 38, "TFLOPS/GPU: 100B on 400 GPUs at >38, 15 PFLOPS"))
    rows.append(paper("ZeRO-100B (stage 2)", "zero_100b", 100e9, 15000 / 400, "15 PFLOPS aggregate / 400 GPUs"))
    return rows


def zero_superlinear(hw):
    """ZeRO Figure 3: the 60B model, P_os+g with MP 16, on 64 to 400 GPUs:
    more ranks shrink each one's model states, so the micro-batch (and with
    it the compute per byte communicated) grows."""
    rows = []
    for ranks in (64, 128, 256, 400):
        run = perf_model.Run(model=model("zero_60b"), ranks=ranks, model_parallel=16, stage=2, micro_batch=0,
                             partition_activations=True)
        rows.append(row("ZeRO-100B (stage 2, MP 16)", "zero_60b", run, hw))  # no accumulation: the batch per GPU is the point
    rows.append(paper("ZeRO-100B (stage 2, MP 16)", "zero_60b", 400, "", "super-linear: aggregate throughput more "
                      "than doubles when the GPUs double (values read off the figure are not in the papers' text)"))
    return rows


def zero_dp_only(hw):
    """ZeRO Figure 4: no model parallelism, 128 GPUs; baseline DP, P_os, P_os+g."""
    rows = []
    for name in ("zero_dp_1.5b", "zero_dp_2.5b", "zero_dp_4b", "zero_dp_6b", "zero_dp_8b", "zero_dp_10b",
                 "zero_dp_11b", "zero_dp_12b", "zero_dp_13b"):
        for series, stage in (("baseline DP (stage 0)", 0), ("P_os (stage 1)", 1), ("P_os+g (stage 2)", 2)):
            rows.append(row(series, name, perf_model.Run(model=model(name), ranks=128, stage=stage, micro_batch=0),
                            hw, global_batch=ZERO_GLOBAL_BATCH))
    rows.append(paper("P_os+g (stage 2)", "zero_dp_13b", 13e9, 40, "13B on 128 GPUs at >40 TFLOPS/GPU"))
    rows.append(paper("baseline DP (stage 0)", "zero_dp_1.5b", 1.4e9, "", "largest model without ZeRO: 1.4B"))
    return rows


def offload_dpu(hw):
    """ZeRO-Offload Figure 9: ZeRO-Offload with and without delayed parameter
    update; Table 3's batch per GPU, as the largest micro-batch our plans fit
    times accumulation."""
    rows = []
    for name, b in (("offload_1b", 32), ("offload_10b", 10)):
        for ranks in (1, 4, 16, 64, 128):
            for dpu in (False, True):
                run = perf_model.Run(model=model(name), ranks=ranks, stage=2, offload_optimizer="cpu", dpu=dpu,
                                     micro_batch=0)
                rows.append(row("ZeRO-Offload + DPU" if dpu else "ZeRO-Offload", name, run, hw,
                                global_batch=b * ranks, max_micro_batch=b))
    rows.append(paper("ZeRO-Offload + DPU", "", "", "1.12-1.59", "DPU speed-up over ZeRO-Offload"))
    return rows


def offload_scaling(hw):
    """ZeRO-Offload Figure 11: the 10B model on 1 to 128 GPUs, ZeRO-Offload
    against ZeRO-2 (which does not fit on few GPUs)."""
    rows = []
    for ranks in (1, 2, 4, 8, 16, 32, 64, 128):
        for series, off in (("ZeRO-Offload", "cpu"), ("ZeRO-2", "none")):
            run = perf_model.Run(model=model("offload_10b"), ranks=ranks, stage=2, offload_optimizer=off,
                                 micro_batch=0)
            rows.append(row(series, "offload_10b", run, hw, global_batch=10 * ranks, max_micro_batch=10))
    rows.append(paper("ZeRO-Offload", "offload_10b", "", 30, ">30 TFLOPS/GPU from 1 to 128 GPUs"))
    return rows


def infinity_efficiency(hw):
    """ZeRO-Infinity Figure 3: the efficiency of a transfer with no overlap
    against its bandwidth, at the paper's 70 TFLOPS peak, for parameters and
    gradients (ait = seq·bsz), optimizer states (seq·bsz/4) and activation
    checkpoints (24·hd·ci, ci = 1): §4's formula, and memwall.perf_model's
    compute / (compute + transfer) for the same bytes and flops."""
    rows = []
    peak = 70.0
    bws = (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    for what, aits in (("parameters and gradients", [(f"seq·bsz = 1024·{b}", 1024 * b) for b in (1, 2, 4, 8, 16)]),
                       ("optimizer states", [(f"seq·bsz/4 = 1024·{b}/4", 1024 * b / 4) for b in (1, 2, 4, 8, 16)]),
                       ("activation checkpoints", [(f"24·hd, hd = {h // 1024}K", 24 * h) for h in
                                                   (2048, 8192, 32768, 65536)])):
        for label, ait in aits:
            for bw in bws:
                formula = perf_model.no_overlap_efficiency(ait, bw, peak)
                # The model's own terms: ait flops per byte of B bytes at 70 TFLOPS, B bytes at bw.
                nbytes = 1e9
                compute, transfer = ait * nbytes / (peak * 1e12), nbytes / (bw * 1e9)
                rows.append(dict(series=f"{what}: {label}", model="", x=bw, value=f"{formula:.4f}",
                                 source="paper", note="§4 formula ait·bw/(ait·bw + peak)"))
                rows.append(dict(series=f"{what}: {label}", model="", x=bw,
                                 value=f"{compute / (compute + transfer):.4f}", source="modeled",
                                 note="compute/(compute+transfer) without overlap"))
    return rows


def infinity_scale(hw):
    """ZeRO-Infinity Figure 5: 512 V100s (32 DGX-2), ZeRO-Infinity with the
    optimizer states and parameters on NVMe against 3D parallelism
    (Megatron MP + ZeRO-1 data parallelism); and 1T on one DGX-2."""
    rows = []
    for name in ("infinity_0.5t", "infinity_1t", "infinity_5t", "infinity_10t", "infinity_20t"):
        run, tiling = tiled(perf_model.Run(model=model(name), ranks=512, stage=3, offload_optimizer="nvme",
                                           offload_param="nvme", micro_batch=0), hw)
        rows.append(row("ZeRO-Infinity (NVMe)", name, run, hw, note=f"activation offload, tiling {tiling}",
                        global_batch=ZERO_GLOBAL_BATCH))
        mp = smallest_mp(name, hw, 512, stage=1, mps=(1, 2, 4, 8, 16))
        if mp is None:
            rows.append(dict(series="3D parallelism (MP <= 16 + ZeRO-1)", model=name,
                             params=perf_model._params(model(name)), ranks=512, stage=1, fits="no", source="modeled",
                             note="no MP degree within a node fits"))
        else:
            rows.append(row("3D parallelism (MP <= 16 + ZeRO-1)", name,
                            perf_model.Run(model=model(name), ranks=512, model_parallel=mp, stage=1, micro_batch=0), hw,
                            note=f"MP {mp}"))
    run, tiling = tiled(perf_model.Run(model=model("infinity_1t"), ranks=16, stage=3, offload_optimizer="nvme",
                                       offload_param="nvme", micro_batch=0), hw)
    rows.append(row("ZeRO-Infinity (NVMe), one DGX-2", "infinity_1t", run, hw,
                    note=f"activation offload, tiling {tiling}",
                    global_batch=ZERO_GLOBAL_BATCH))
    rows.append(paper("ZeRO-Infinity (NVMe)", "", "", 25000 / 512, "25 PFLOPS on 512 GPUs (49 TFLOPS/GPU)"))
    rows.append(paper("ZeRO-Infinity (NVMe), one DGX-2", "infinity_1t", "", 27, "1T at 27 TFLOPS/GPU on one DGX-2"))
    return rows


FIGURES = {
    "zero_throughput": (zero_throughput, "ZeRO (SC20) §10.2, Figure 2",
                        "TFLOPS per GPU of 1.5B-170B GPTs on 400 V100s: ZeRO-100B (stage 2) against Megatron MP"),
    "zero_superlinear": (zero_superlinear, "ZeRO (SC20) §10.3, Figure 3",
                         "the 60B GPT on 64-400 V100s: per-GPU throughput grows with the GPUs"),
    "zero_dp_only": (zero_dp_only, "ZeRO (SC20) §10.4, Figure 4",
                     "data parallelism alone on 128 V100s: which models fit and their TFLOPS at stages 0, 1, 2"),
    "offload_dpu": (offload_dpu, "ZeRO-Offload (ATC21) §6.2.3, Figure 9",
                    "ZeRO-Offload with and without delayed parameter update, 1B and 10B, 1-128 V100s"),
    "offload_scaling": (offload_scaling, "ZeRO-Offload (ATC21) §6.2.4, Figure 11",
                        "the 10B GPT on 1-128 V100s: ZeRO-Offload against ZeRO-2"),
    "infinity_efficiency": (infinity_efficiency, "ZeRO-Infinity (SC21) §4, Figure 3",
                            "efficiency against bandwidth for parameters and gradients, optimizer states and "
                            "activation checkpoints at 70 TFLOPS"),
    "infinity_scale": (infinity_scale, "ZeRO-Infinity (SC21) §8.2, Figure 5",
                       "0.5T-20T GPTs on 512 V100s: ZeRO-Infinity (NVMe) against 3D parallelism; 1T on one DGX-2"),
}


def held_out_error(workspace):
    path = os.path.join(workspace, "results", "perf_model_calibration", "calibration.csv")
    try:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["quantity"] == "held-out mean |error|":
                    return f"{float(r['value']):.1%} mean |error| on {r['how']} held out (CpuDevice)"
    except OSError:
        pass
    return "unknown: run //repro:perf_model_calibration"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--figure", required=True, choices=sorted(FIGURES))
    ap.add_argument("--hardware", default="v100_dgx2", help="a file of python/memwall/hardware/ or a path")
    ap.add_argument("--results_dir", default="", help="default: <workspace>/results")
    args = ap.parse_args(argv)
    workspace = memwall.workspace_dir()
    hw = perf_model.load_hardware(args.hardware)
    fn, paper_ref, description = FIGURES[args.figure]
    out = os.path.join(args.results_dir or os.path.join(workspace, "results"), args.figure)
    os.makedirs(out, exist_ok=True)
    rows = fn(hw)
    with open(os.path.join(out, "data.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    for r in rows:
        if r["source"] == "modeled" and r.get("tflops_per_gpu"):
            print(f"{r['series']:40s} {r['model']:14s} ranks {r['ranks']:>4} MP {r['model_parallel']:>2} "
                  f"b {r['micro_batch']:>2} x{r['accumulation']:<3} {r['tflops_per_gpu']:>6} TFLOPS/GPU "
                  f"{r['total_pflops']:>7} PFLOPS{'' if r['fits'] == 'yes' else '  (does not fit)'}")
        elif r["source"] == "modeled" and r.get("fits") == "no":
            print(f"{r['series']:40s} {r['model']:14s} does not fit: {r['note']}")
    subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures",
                                                     "modeled.py"), out, args.figure], check=True)
    memwall.write_provenance(
        os.path.join(out, "provenance.json"), experiment=args.figure, description=description, paper=paper_ref,
        command="./bazelw run //repro:%s -- %s" % (args.figure, " ".join(shlex.quote(a) for a in argv
                                                                          if not a.startswith("--figure"))),
        measured_or_modeled=f"modeled: memwall.perf_model on {hw.name} ({args.hardware}), memory from "
                            f"memwall.estimate; the model's error: {held_out_error(workspace)}; source=paper rows "
                            "are the paper's values",
        files={"data.csv": "one row per modeled point (source=modeled) and the paper's values (source=paper)",
               "figure.png": "drawn by repro/figures/modeled.py from data.csv"})
    print(f"wrote {out}/{{data.csv, figure.png, provenance.json}}")


if __name__ == "__main__":
    main(sys.argv[1:])
