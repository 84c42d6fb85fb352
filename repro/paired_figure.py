"""Shared by infinity_prefetch.py and infinity_activation_offload.py: per model,
without and with a feature, throughput (left) and device / pinned host peaks
(right), the ratio with / without on top of each pair.
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def draw(data_path, out_path, feature, title):
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(os.path.dirname(data_path), "summary.csv"), newline="") as f:
        summary = list(csv.DictReader(f))
    models = [r["model"] for r in summary]
    off = {r["model"]: r for r in rows if not r["mode"].endswith(feature)}
    on = {r["model"]: r for r in rows if r["mode"].endswith(feature)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.38
    xs = range(len(models))

    def cell(table, model, key):
        value = table.get(model, {}).get(key, "")
        return float(value) if value else 0.0

    ax = axes[0]
    ax.bar([x - width / 2 for x in xs], [cell(off, m, "tokens_per_second") for m in models], width, label="without")
    ax.bar([x + width / 2 for x in xs], [cell(on, m, "tokens_per_second") for m in models], width,
           label="with " + feature.lstrip("+"))
    for x, r in zip(xs, summary):
        if r["throughput_ratio"]:
            top = max(cell(off, r["model"], "tokens_per_second"), cell(on, r["model"], "tokens_per_second"))
            ax.text(x, top, "%sx" % r["throughput_ratio"], ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(["%s\nd=%s" % (r["model"], r["hidden"]) for r in summary], fontsize=8)
    ax.set_ylabel("tokens / s (CpuDevice)")
    ax.set_title(title + ": throughput")
    ax.legend(fontsize=8)

    ax = axes[1]
    for table, label, shift in ((off, "without", -width / 2), (on, "with", width / 2)):
        ax.bar([x + shift for x in xs], [cell(table, m, "device_peak_bytes") / 2**20 for m in models], width,
               label="device, " + label)
        ax.plot([x + shift for x in xs], [cell(table, m, "host_pinned_peak_bytes") / 2**20 for m in models], "o",
                label="pinned host, " + label)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_ylabel("peak (MiB)")
    ax.set_title(title + ": memory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
