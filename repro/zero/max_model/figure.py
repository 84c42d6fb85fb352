"""Figure for results/zero_max_model (ZeRO Table 2): the largest model whose
model states fit one device, per ZeRO stage and model-parallel degree.

Bars: the estimator (model states), per stage, one group per MP degree (log
scale); markers: the paper's formula (ZeRO Table 2's theoretical columns)
and the estimator with the reduce and all-gather buckets counted too.

usage: figure.py DATA.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = ("baseline (DP)", "P_os", "P_os+g", "P_os+g+p")


def main(data_path, out_path):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    degrees = sorted({int(r["model_parallel"]) for r in rows})
    gpus = {int(r["model_parallel"]): int(r["gpus"]) for r in rows}

    def value(mp, stage, source):
        return next(float(r["max_params"]) for r in rows
                    if int(r["model_parallel"]) == mp and int(r["stage"]) == stage and r["source"] == source) / 1e9

    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.2
    for stage in range(4):
        xs = [d + (stage - 1.5) * width for d in range(len(degrees))]
        est = [value(mp, stage, "estimator") for mp in degrees]
        ax.bar(xs, est, width, label=STAGES[stage] + " (estimator)")
        ax.plot(xs, [value(mp, stage, "paper formula") for mp in degrees], "k_", markersize=14,
                label="paper formula" if stage == 0 else None)
        ax.plot(xs, [value(mp, stage, "estimator with buckets") for mp in degrees], "rv", markersize=4,
                label="estimator with buckets" if stage == 0 else None)
        for x, v in zip(xs, est):
            ax.text(x, v, "%.3g" % v, rotation=90, fontsize=6, ha="center", va="bottom")
    ax.set_yscale("log")
    ax.set_xticks(range(len(degrees)))
    ax.set_xticklabels(["MP %d\n%d GPUs" % (mp, gpus[mp]) for mp in degrees])
    ax.set_ylabel("largest model (billions of parameters)")
    ax.set_title("ZeRO Table 2: largest model whose model states fit one device")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
