"""Figure for results/offload_max_model: the largest GPT each mode trains.

Left: per mode, the largest ladder model whose steps all completed (bars,
millions of parameters; the ratio to stage 0 and the last step's TFLOPS and
device idle fraction on top), beside the paper's one
V100 (PyTorch 1.4B, ZeRO-Offload 13B: 9.3x) scaled by the ladder's 1/28.4.
Right: every attempt's device peak against its parameters, with the budget.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # repro/
from attempts_figure import bar_largest, label_attempts, plot_attempts, rate_note, read_result  # noqa: E402

COLORS = {"stage0": "#7f7f7f", "stage2": "#1f77b4", "stage2+offload": "#2ca02c", "stage2+offload+dpu": "#d62728"}


def main(data_path, out_path):
    rows, summary = read_result(data_path)
    measured = [r for r in summary if r["source"] == "measured"]
    paper = [r for r in summary if r["source"] == "paper"]

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    heights = bar_largest(ax, measured, COLORS,
                          lambda r: ("\n%.1fx" % float(r["ratio_to_stage0"]) if r["ratio_to_stage0"] else "") + rate_note(r),
                          9)
    for r, style in zip(paper, [":", "--"]):
        scaled = int(r["largest_params"]) / 28.4 / 1e6
        ax.axhline(scaled, color="#777777", linestyle=style, linewidth=1,
                   label="%s / 28.4 = %.0fM" % (r["largest_model"], scaled))
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xticklabels([r["mode"] for r in measured], fontsize=9)
    ax.set_ylabel("largest model that trains (M parameters)")
    ax.set_title("Largest model on one device")
    ax.set_ylim(0, max(heights + [1]) * 1.45)

    ax = axes[1]
    for mode, color in COLORS.items():
        dpu = mode.endswith("dpu")  # DPU's device peak is offload's: drawn over it
        plot_attempts(ax, [r for r in rows if r["mode"] == mode and r["device_peak_bytes"]],
                      lambda r: int(r["params"]) / 1e6, lambda r: int(r["device_peak_bytes"]) / 2**20, mode,
                      color=color, style="s--" if dpu else "o-", markersize=4 if dpu else 6)
    label_attempts(ax, "parameters (M)", "device peak", "Device memory per attempt")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
