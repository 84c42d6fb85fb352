"""Figure for results/offload_throughput: rate and device idleness per mode.

Left: tokens/s per (model, mode), a missing bar where the mode does not fit.
Middle: TFLOPS as a fraction of the device's GEMM rate measured in the same
run. Right: the fraction of each step the compute stream was idle.

usage: figure.py DATA.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"stage0": "#7f7f7f", "stage2": "#1f77b4", "stage2+offload": "#2ca02c", "stage2+offload+dpu": "#d62728"}


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    modes = [m for m in COLORS if any(r["mode"] == m for r in rows)]
    width = 0.8 / max(1, len(modes))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    panels = [("tokens_per_second", "tokens/s", 1.0), ("fraction_of_gemm", "TFLOPS / device GEMM rate", 1.0),
              ("device_idle_fraction", "device idle fraction of the step", 1.0)]
    for ax, (column, label, _) in zip(axes, panels):
        for k, mode in enumerate(modes):
            xs, ys = [], []
            for i, model in enumerate(models):
                for r in rows:
                    if r["model"] == model and r["mode"] == mode and r["fits"] == "yes" and r[column]:
                        xs.append(i + (k - (len(modes) - 1) / 2) * width)
                        ys.append(float(r[column]))
            ax.bar(xs, ys, width, color=COLORS[mode], label=mode)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(["%s\n%.0fM" % (m, int(next(r["params"] for r in rows if r["model"] == m)) / 1e6)
                            for m in models], fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    axes[0].set_title("Throughput (no bar: does not fit)")
    axes[1].set_title("Share of the device's GEMM rate")
    axes[2].set_title("Device idle")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
