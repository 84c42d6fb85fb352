"""Figure for results/infinity_memory (ZeRO-Infinity Figure 2a): per model,
where its memory goes under each placement of the model states.

Left: per rank, device / pinned host / NVMe bytes (log scale), one group of
bars per model, one bar per placement (estimator).
Right: the paper's formulas against the estimator for model states (all
ranks), activation checkpoints and the two working memories (per rank).

usage: figure.py DATA.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    placements = []
    for r in rows:
        if r["source"] == "estimator" and r["placement"] not in placements:
            placements.append(r["placement"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    ax = axes[0]
    width = 0.8 / max(1, len(placements))
    spaces = (("device_bytes_per_rank", "device", "#1f77b4"), ("host_bytes_per_rank", "host", "#2ca02c"),
              ("nvme_bytes_per_rank", "NVMe", "#9467bd"))
    for p, placement in enumerate(placements):
        for m, model in enumerate(models):
            r = next(x for x in rows if x["model"] == model and x["placement"] == placement)
            bottom = 0.0
            for key, label, color in spaces:
                v = float(r[key] or 0) / 2**30
                if v <= 0:
                    continue
                ax.bar(m + (p - (len(placements) - 1) / 2) * width, v, width, bottom=bottom, color=color,
                       edgecolor="white", label=label if (p, m) == (0, 0) or False else None)
                bottom += v
            if m == 0:
                ax.text(m + (p - (len(placements) - 1) / 2) * width, bottom, placement.replace("stage3", "Z3"),
                        rotation=90, fontsize=6, ha="center", va="bottom")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in spaces]
    ax.legend(handles, [label for _, label, _ in spaces], fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([m.replace("infinity_", "") for m in models])
    ax.set_ylabel("GiB per rank (estimator)")
    ax.set_title("Per rank, per placement, bars left to right:\n%s" % ", ".join(placements), fontsize=10)

    ax = axes[1]
    quantities = (("model_states_total_bytes", "model states (all ranks)", "o"),
                  ("activation_checkpoint_bytes_per_rank", "activation checkpoints", "s"),
                  ("model_state_working_bytes_per_rank", "model-state working", "^"),
                  ("activation_working_bytes_per_rank", "activation working", "D"))
    est = placements[0] if placements else None
    for key, label, marker in quantities:
        formula = [float(next(x for x in rows if x["model"] == m and x["source"] == "paper formula")[key]) / 2**30
                   for m in models]
        line, = ax.plot(range(len(models)), formula, marker + "--", label=label + " (paper formula)")
        if est:
            got = [float(next(x for x in rows if x["model"] == m and x["placement"] == est)[key]) / 2**30
                   for m in models]
            ax.plot(range(len(models)), got, marker + "-", color=line.get_color(), label=label + " (estimator, %s)" % est)
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([m.replace("infinity_", "") for m in models])
    ax.set_ylabel("GiB")
    ax.set_title("Paper formulas against the estimator")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
