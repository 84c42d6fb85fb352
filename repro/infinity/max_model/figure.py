"""Figure for results/infinity_max_model: the largest GPT each ZeRO-3 mode trains.

Left: per mode (ZeRO-3, + CPU offload of the optimizer states, + NVMe
offload of them, each offload also with the 16-bit parameters on the CPU,
and NVMe offload with the parameters on NVMe too, and with the gradient
shard there as well: every model state on NVMe),
the largest ladder model whose steps all completed (bars, millions of
parameters; on top the ratio to CPU offload, to CPU offload with the
parameters, the paper's ratio over ZeRO-Inf-CPU, and the last step's TFLOPS and
device idle fraction).
Right: every attempt's pinned host peak against its parameters: CPU
offload's grows 14 bytes per parameter (bf16), NVMe offload's 2 (the
gradient shard) plus its swap buffers; with the parameters on the CPU
each gains 2 more, with them on NVMe only a few swap buffers, and with
every model state on NVMe not the 2 of the gradient shard either.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # repro/
from attempts_figure import bar_largest, label_attempts, plot_attempts, rate_note, read_result  # noqa: E402

COLORS = {"stage3": "#1f77b4", "stage3+offload": "#2ca02c", "stage3+nvme": "#9467bd",
          "stage3+offload+params": "#8c564b", "stage3+nvme+params": "#e377c2",
          "stage3+nvme+nvme-params": "#ff7f0e", "stage3+nvme-all": "#d62728"}


def main(data_path, out_path):
    rows, summary = read_result(data_path)
    measured = [r for r in summary if r["source"] == "measured"]
    paper = {r["mode"]: r for r in summary if r["source"] == "paper"}

    fig, axes = plt.subplots(1, 2, figsize=(16, 5.2), gridspec_kw={"width_ratios": [1.4, 1]})
    ax = axes[0]

    def note(r):
        lines = ""
        if r["ratio_to_cpu_offload"]:
            lines += "\n%.2fx" % float(r["ratio_to_cpu_offload"])
        if r.get("ratio_to_cpu_offload_with_params"):
            lines += "\n%.2fx of +params" % float(r["ratio_to_cpu_offload_with_params"])
        if r["mode"] in paper:
            lines += "\n(paper %.2fx)" % float(paper[r["mode"]]["ratio_to_cpu_offload_with_params"])
        return lines + rate_note(r)

    heights = bar_largest(ax, measured, COLORS, note, 7)
    ax.set_xticklabels([r["mode"].replace("+", "\n+") for r in measured], fontsize=8)
    ax.set_ylabel("largest model that trains (M parameters)")
    ax.set_title("Largest model on one device (ratio to CPU offload)")
    ax.set_ylim(0, max(heights + [1]) * 1.45)

    ax = axes[1]
    for mode, color in COLORS.items():
        plot_attempts(ax, [r for r in rows if r["mode"] == mode and r["host_pinned_peak_bytes"]],
                      lambda r: int(r["params"]) / 1e6, lambda r: int(r["host_pinned_peak_bytes"]) / 2**20, mode,
                      color=color)
    label_attempts(ax, "parameters (M)", "pinned host peak", "Pinned host memory per attempt")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
