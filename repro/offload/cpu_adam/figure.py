"""Figure for results/offload_cpu_adam (ZeRO-Offload Table 4): seconds per
Adam step of memwall's CPU Adam and torch's, per size (log-log), and torch's
time over memwall's beside the paper's (1B and 10B on a DGX-2's CPUs).

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
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ax = axes[0]
    for source, style in (("measured", "-"), ("paper (Table 4)", ":")):
        for impl, color in (("memwall", "#2ca02c"), ("CPU-Adam", "#2ca02c"), ("torch", "#7f7f7f"),
                            ("PT-CPU", "#7f7f7f")):
            pts = [(float(r["params"]), float(r["seconds_per_step"])) for r in rows
                   if r["source"] == source and r["implementation"] == impl]
            if pts:
                ax.plot([p for p, _ in pts], [s for _, s in pts], "o" + style, color=color,
                        label="%s (%s)" % (impl, source))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("seconds per Adam step")
    ax.set_title("Adam step time (measured: this machine's CPU)")
    ax.legend(fontsize=7)
    ax = axes[1]
    labels, ratios, colors = [], [], []
    seen = set()
    for r in rows:
        key = (r["source"], r["params"])
        if key in seen:
            continue
        seen.add(key)
        n = float(r["params"])
        labels.append("%s\n%s" % ("%.3gB" % (n / 1e9) if n >= 1e9 else "%.3gM" % (n / 2**20),
                                  "paper" if r["source"] != "measured" else "here"))
        ratios.append(float(r["torch_over_memwall"]))
        colors.append("#1f77b4" if r["source"] == "measured" else "#ff7f0e")
    ax.bar(range(len(ratios)), ratios, color=colors)
    for i, v in enumerate(ratios):
        ax.text(i, v, "%.2fx" % v, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("torch's step time / memwall's")
    ax.set_title("Speed-up of the CPU Adam over PyTorch's")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
