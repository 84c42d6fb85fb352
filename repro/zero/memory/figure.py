"""Figure for results/zero_memory: model-state bytes per rank.

Left: the sweep measured on the CpuDevice, beside the estimator and the
paper's formula, for every (stage, ranks). Right: ZeRO's Figure 1 example
(7.5B parameters, 64 ranks) from the estimator, with the figure's printed
values.

usage: figure.py DATA.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = ["0 (DP)", "1 (P_os)", "2 (P_os+g)", "3 (P_os+g+p)"]


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    sweep = [r for r in rows if r["part"] == "sweep"]
    modeled = [r for r in rows if r["part"] == "modeled"]

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    ax = axes[0]
    points = sorted({(int(r["stage"]), int(r["ranks"])) for r in sweep})
    sources = [("measured", "#1f77b4"), ("estimator", "#ff7f0e"), ("paper", "#7f7f7f")]
    width = 0.27
    for k, (source, color) in enumerate(sources):
        values = {}
        for r in sweep:
            if r["source"] == source:
                values[(int(r["stage"]), int(r["ranks"]))] = int(r["model_states_bytes_per_rank"]) / 2**20
        xs = [i + (k - 1) * width for i in range(len(points))]
        ax.bar(xs, [values.get(p, 0) for p in points], width, label=source, color=color)
    totals = {(int(r["stage"]), int(r["ranks"])): int(r["total_device_bytes_per_rank"]) / 2**20
              for r in sweep if r["source"] == "measured"}
    ax.scatter(range(len(points)), [totals.get(p, 0) for p in points], marker="_", s=400, color="black",
               label="all device memory, measured peak")
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([f"s{s}\nN={n}" for s, n in points], fontsize=8)
    psi = int(sweep[0]["params"]) if sweep else 0
    ax.set_ylabel("model states per rank (MiB)")
    ax.set_title(f"measured on the CpuDevice, Ψ = {psi:,} parameters (bf16 + fp32 Adam)")
    ax.legend()

    ax = axes[1]
    labels = sorted({r["label"] for r in modeled})
    if labels:
        label = labels[0]
        est = {int(r["stage"]): int(r["model_states_bytes_per_rank"]) / 1e9
               for r in modeled if r["label"] == label and r["source"] == "estimator"}
        fig1 = {int(r["stage"]): int(r["model_states_bytes_per_rank"]) / 1e9
                for r in modeled if r["label"] == label and r["source"] == "paper_figure"}
        bars = ax.bar(range(4), [est.get(s, 0) for s in range(4)], color="#ff7f0e", label="estimator")
        for s, bar in enumerate(bars):
            text = f"{est.get(s, 0):.1f} GB"
            if s in fig1:
                text += f"\n(paper {fig1[s]:.1f})"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(4))
        ax.set_xticklabels(STAGES, fontsize=8)
        ax.set_ylabel("model states per device (GB)")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(0, max(est.values()) * 1.25)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
