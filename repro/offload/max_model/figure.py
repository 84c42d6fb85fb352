"""Figure for results/offload_max_model: the largest GPT each mode trains.

Left: per mode, the largest ladder model whose steps all completed (bars,
millions of parameters; the ratio to stage 0 on top), beside the paper's one
V100 (PyTorch 1.4B, ZeRO-Offload 13B: 9.3x) scaled by the ladder's 1/28.4.
Right: every attempt's device peak against its parameters, with the budget.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"stage0": "#7f7f7f", "stage2": "#1f77b4", "stage2+offload": "#2ca02c", "stage2+offload+dpu": "#d62728"}


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(os.path.dirname(data_path), "summary.csv"), newline="") as f:
        summary = list(csv.DictReader(f))
    measured = [r for r in summary if r["source"] == "measured"]
    paper = [r for r in summary if r["source"] == "paper"]

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    xs = range(len(measured))
    heights = [int(r["largest_params"]) / 1e6 for r in measured]
    ax.bar(xs, heights, color=[COLORS.get(r["mode"], "#333") for r in measured])
    for x, r, h in zip(xs, measured, heights):
        label = r["largest_model"] or "none"
        if r["ratio_to_stage0"]:
            label += "\n%.1fx" % float(r["ratio_to_stage0"])
        ax.text(x, h, label, ha="center", va="bottom", fontsize=9)
    for r, style in zip(paper, [":", "--"]):
        scaled = int(r["largest_params"]) / 28.4 / 1e6
        ax.axhline(scaled, color="#777777", linestyle=style, linewidth=1,
                   label="%s / 28.4 = %.0fM" % (r["largest_model"], scaled))
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["mode"] for r in measured], fontsize=9)
    ax.set_ylabel("largest model that trains (M parameters)")
    ax.set_title("Largest model on one device")
    ax.set_ylim(0, max(heights + [1]) * 1.35)

    ax = axes[1]
    for mode, color in COLORS.items():
        pts = [r for r in rows if r["mode"] == mode and r["device_peak_bytes"]]
        fit = [r for r in pts if r["fits"] == "yes"]
        no = [r for r in pts if r["fits"] != "yes"]
        style = "s--" if mode.endswith("dpu") else "o-"  # DPU's device peak is offload's: drawn over it
        ax.plot([int(r["params"]) / 1e6 for r in fit], [int(r["device_peak_bytes"]) / 2**20 for r in fit],
                style, color=color, label=mode, markersize=4 if mode.endswith("dpu") else 6)
        ax.plot([int(r["params"]) / 1e6 for r in no], [int(r["device_peak_bytes"]) / 2**20 for r in no],
                "x", color=color, markersize=10)
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("device peak (MiB); x: refused at that point")
    ax.set_title("Device memory per attempt")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
