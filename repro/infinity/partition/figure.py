"""Figure for results/infinity_partition: ZeRO-Infinity's bandwidth-centric
partitioning against ZeRO's contiguous one (Figure 6c).

Left: gather bandwidth per rank (bytes a step gathers over the time the
collective stream spent fetching and gathering) at each world size.
Right: step throughput (tokens/s, all ranks) at each world size.

usage: figure.py DATA.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"contiguous": "#1f77b4", "bandwidth-centric": "#ff7f0e"}


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == "measured"]
    ranks = sorted({int(r["ranks"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    for i, (column, title, unit) in enumerate(
            [("gather_gb_per_s", "Gather bandwidth per rank", "GB/s"),
             ("tokens_per_second", "Step throughput", "tokens/s")]):
        ax = axes[i]
        for j, (part, color) in enumerate(COLORS.items()):
            ys = []
            for n in ranks:
                match = [r for r in rows if int(r["ranks"]) == n and r["partitioning"] == part]
                ys.append(float(match[0][column]) if match else 0.0)
            xs = [k + (j - 0.5) * width for k in range(len(ranks))]
            ax.bar(xs, ys, width, color=color, label=part)
            for x, y in zip(xs, ys):
                ax.text(x, y, "%.3g" % y, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(range(len(ranks))))
        ax.set_xticklabels(["%d rank%s" % (n, "" if n == 1 else "s") for n in ranks])
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("ZeRO-3, parameters and optimizer on the host: contiguous vs bandwidth-centric partitioning "
                 "(CpuDevice, measured)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
