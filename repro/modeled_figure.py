"""results/<figure>/figure.png for repro/modeled.py's figures: modeled
TFLOPS per GPU against model size or GPU count per series, the paper's
values as stars; infinity_efficiency: efficiency against bandwidth."""
import csv
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out, figure = sys.argv[1], sys.argv[2]
with open(os.path.join(out, "data.csv")) as f:
    rows = list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


if figure == "infinity_efficiency":
    groups = ("parameters and gradients", "optimizer states", "activation checkpoints")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, group in zip(axes, groups):
        for series in dict.fromkeys(r["series"] for r in rows if r["series"].startswith(group)):
            pts = [(float(r["x"]), float(r["value"])) for r in rows if r["series"] == series and r["source"] == "modeled"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=series.split(": ", 1)[1])
            paper = [(float(r["x"]), float(r["value"])) for r in rows if r["series"] == series and r["source"] == "paper"]
            ax.plot([p[0] for p in paper], [p[1] for p in paper], "k:", lw=0.7)
        ax.set_xscale("log")
        ax.set_xlabel("bandwidth (GB/s)")
        ax.set_ylabel("efficiency at 70 TFLOPS")
        ax.set_title(group)
        ax.legend(fontsize=7)
else:
    x_col = "params" if figure in ("zero_throughput", "zero_dp_only", "infinity_scale") else "ranks"
    fig, ax = plt.subplots(figsize=(8, 5))
    keys = dict.fromkeys((r["series"], r["model"] if figure == "offload_dpu" else "") for r in rows
                         if r["source"] == "modeled")
    for series, name in keys:
        pts = sorted((float(r[x_col]), float(r["tflops_per_gpu"])) for r in rows
                     if r["source"] == "modeled" and r["series"] == series and (not name or r["model"] == name)
                     and r["fits"] == "yes" and r["tflops_per_gpu"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{series} {name}".strip())
    for r in rows:
        if r["source"] == "paper" and num(r["x"]) is not None and num(r["value"]) is not None:
            ax.plot(float(r["x"]), float(r["value"]), "k*", ms=12)
            ax.annotate("paper", (float(r["x"]), float(r["value"])), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("parameters" if x_col == "params" else "GPUs")
    ax.set_ylabel("TFLOPS per GPU (modeled)")
    ax.legend(fontsize=8)
fig.suptitle(f"{figure}: modeled (memwall.perf_model, V100 DGX-2); stars: the paper")
fig.tight_layout()
fig.savefig(os.path.join(out, "figure.png"), dpi=110)
