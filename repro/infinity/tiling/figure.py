"""Figure for results/infinity_tiling: the largest hidden size per tiling factor.

Left: per memory-centric tiling factor, the largest hidden size that trained
(measured) and that the estimator admits, under the same device budget; the
ratio to the untiled one on top, and the paper's (8K untiled, 64K at 16: 8x).
Right: every measured attempt's device peak against its hidden size, one
line per factor, with the budget; x marks a refusal.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # repro/
from attempts_figure import label_attempts, plot_attempts, read_result  # noqa: E402


def main(data_path, out_path):
    rows, summary = read_result(data_path)
    factors = sorted({int(r["tiling"]) for r in summary if r["source"] != "paper"})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    width = 0.38
    for offset, source, color in ((-width / 2, "measured", "#1f77b4"), (width / 2, "estimator", "#ff7f0e")):
        got = {int(r["tiling"]): r for r in summary if r["source"] == source}
        xs = [i + offset for i, _ in enumerate(factors)]
        hs = [int(got[f]["largest_hidden"]) if f in got else 0 for f in factors]
        ax.bar(xs, hs, width, color=color, label=source)
        for x, f, h in zip(xs, factors, hs):
            ratio = got.get(f, {}).get("ratio_to_untiled", "")
            ax.text(x, h, "%d\n%sx" % (h, ratio) if ratio else str(h), ha="center", va="bottom", fontsize=7)
    paper = {int(r["tiling"]): r for r in summary if r["source"] == "paper"}
    note = ", ".join("factor %d: %s" % (f, paper[f]["largest_hidden"]) for f in sorted(paper))
    ax.set_xticks(range(len(factors)))
    ax.set_xticklabels([str(f) for f in factors])
    ax.set_xlabel("tiling factor (paper, one V100: %s)" % note)
    ax.set_ylabel("largest hidden size that trains")
    ax.set_title("Memory-centric tiling: largest hidden size")
    ax.legend(fontsize=8)
    top = max([int(r["largest_hidden"]) for r in summary if r["source"] != "paper"] + [1])
    ax.set_ylim(0, top * 1.3)

    ax = axes[1]
    for f in factors:
        plot_attempts(ax, [r for r in rows
                           if r["source"] == "measured" and int(r["tiling"]) == f and r["device_peak_bytes"]],
                      lambda r: int(r["hidden"]), lambda r: int(r["device_peak_bytes"]) / 2**20, "factor %d" % f)
    label_attempts(ax, "hidden size", "device peak", "Device memory per attempt")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
