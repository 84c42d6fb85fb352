"""What the papers' modeled multi-node results share: memwall.perf_model on
the V100 DGX-2 (python/memwall/hardware/v100_dgx2.json), memory from
memwall.estimate (the engine's plans), beside the paper's values. Each
result's folder holds its points (repro/zero/throughput/zero_throughput.py
and the others of repro/README.md's table), and main() writes them:

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


def tiled_row(series, name, run, hw, global_batch, factors=(1, 2, 4, 8, 16, 32, 64)):
    """`run` with its activation checkpoints offloaded to the host (ZeRO-Infinity
    §5.1.2) and the memory-centric tiling factor (§5.1.3) a user would pick:
    of the factors at which micro-batch 1 fits, the one whose row (at its
    largest micro-batch, `global_batch` sequences a step) the model predicts
    fastest. Tiling shrinks the gathered working set, so a larger factor can
    buy a larger micro-batch; the smallest fitting factor is not always the
    fastest. The last factor's row when none fits."""
    best = None
    for t in factors:
        tiled_run = dataclasses.replace(run, model=f"{run.model} offload_activations: true tiling: {t}")
        r = row(series, name, tiled_run, hw, note=f"activation offload, tiling {t}", global_batch=global_batch)
        if r["fits"] == "yes" and (best is None or float(r["tflops_per_gpu"]) > float(best["tflops_per_gpu"])):
            best = r
    return best or r


def paper(series, name, x, value, note):
    return dict(series=series, model=name, x=x, value=value, source="paper", note=note)


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


def main(name, points, paper_ref, description, argv):
    """Writes results/<name>/: `points(hw)`'s rows (dicts over COLUMNS),
    their figure and provenance."""
    ap = argparse.ArgumentParser(description=f"{paper_ref}, modeled: {description}")
    ap.add_argument("--hardware", default="v100_dgx2", help="a file of python/memwall/hardware/ or a path")
    ap.add_argument("--results_dir", default="",
                    help="default: <workspace>/out/results (--results_dir=results for the tracked results/)")
    args = ap.parse_args(argv)
    workspace = memwall.workspace_dir()
    hw = perf_model.load_hardware(memwall.user_path(args.hardware) if args.hardware.endswith(".json") else args.hardware)
    results_dir = memwall.user_path(args.results_dir)
    out = os.path.join(results_dir or os.path.join(workspace, "out", "results"), name)
    os.makedirs(out, exist_ok=True)
    rows = points(hw)
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
    subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "modeled_figure.py"),
                    out, name], check=True)
    memwall.write_provenance(
        os.path.join(out, "provenance.json"), experiment=name, description=description, paper=paper_ref,
        command="./bazelw run //repro:%s -- %s" % (name, " ".join(shlex.quote(a) for a in argv)),
        measured_or_modeled=f"modeled: memwall.perf_model on {hw.name} ({args.hardware}), memory from "
                            f"memwall.estimate; the model's error: {held_out_error(workspace)}; source=paper rows "
                            "are the paper's values",
        files={"data.csv": "one row per modeled point (source=modeled) and the paper's values (source=paper)",
               "figure.png": "drawn by repro/modeled_figure.py from data.csv"})
    print(f"wrote {out}/{{data.csv, figure.png, provenance.json}}")
