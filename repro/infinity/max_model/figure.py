"""Figure for results/infinity_max_model: the largest GPT each ZeRO-3 mode trains.

Left: per mode (ZeRO-3, + CPU offload of the optimizer states, + NVMe
offload of them, each offload also with the 16-bit parameters on the CPU,
and NVMe offload with the parameters on NVMe too),
the largest ladder model whose steps all completed (bars, millions of
parameters; on top the ratio to CPU offload, to CPU offload with the
parameters, and the paper's ratio over ZeRO-Inf-CPU).
Right: every attempt's pinned host peak against its parameters: CPU
offload's grows 14 bytes per parameter (bf16), NVMe offload's 2 (the
gradient shard) plus its swap buffers; with the parameters on the CPU
each gains 2 more, with them on NVMe only a few swap buffers.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"stage3": "#1f77b4", "stage3+offload": "#2ca02c", "stage3+nvme": "#9467bd",
          "stage3+offload+params": "#8c564b", "stage3+nvme+params": "#e377c2",
          "stage3+nvme+nvme-params": "#ff7f0e"}


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(os.path.dirname(data_path), "summary.csv"), newline="") as f:
        summary = list(csv.DictReader(f))
    measured = [r for r in summary if r["source"] == "measured"]
    paper = {r["mode"]: r for r in summary if r["source"] == "paper"}

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    xs = range(len(measured))
    heights = [int(r["largest_params"]) / 1e6 for r in measured]
    ax.bar(xs, heights, color=[COLORS.get(r["mode"], "#333") for r in measured])
    for x, r, h in zip(xs, measured, heights):
        label = r["largest_model"] or "none"
        if r["ratio_to_cpu_offload"]:
            label += "\n%.2fx" % float(r["ratio_to_cpu_offload"])
        if r.get("ratio_to_cpu_offload_with_params"):
            label += "\n%.2fx of +params" % float(r["ratio_to_cpu_offload_with_params"])
        if r["mode"] in paper:
            label += "\n(paper %.2fx)" % float(paper[r["mode"]]["ratio_to_cpu_offload_with_params"])
        ax.text(x, h, label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["mode"].replace("+", "\n+") for r in measured], fontsize=8)
    ax.set_ylabel("largest model that trains (M parameters)")
    ax.set_title("Largest model on one device (ratio to CPU offload)")
    ax.set_ylim(0, max(heights + [1]) * 1.45)

    ax = axes[1]
    for mode, color in COLORS.items():
        pts = [r for r in rows if r["mode"] == mode and r["host_pinned_peak_bytes"]]
        fit = [r for r in pts if r["fits"] == "yes"]
        no = [r for r in pts if r["fits"] != "yes"]
        ax.plot([int(r["params"]) / 1e6 for r in fit], [int(r["host_pinned_peak_bytes"]) / 2**20 for r in fit],
                "o-", color=color, label=mode)
        ax.plot([int(r["params"]) / 1e6 for r in no], [int(r["host_pinned_peak_bytes"]) / 2**20 for r in no],
                "x", color=color, markersize=10)
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("pinned host peak (MiB); x: refused at that point")
    ax.set_title("Pinned host memory per attempt")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
