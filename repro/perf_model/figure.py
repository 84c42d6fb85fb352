"""results/perf_model_calibration/figure.png: predicted against measured step
seconds, one panel per machine, fit and held-out steps apart, with the
diagonal and ±15%.

    figure.py OUT [TITLES]   TITLES: a JSON object, machine -> panel title
"""
import csv
import json
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = sys.argv[1]
TITLES = dict({"dev_vm": "dev VM (CpuDevice)"}, **(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
with open(os.path.join(out, "data.csv")) as f:
    rows = list(csv.DictReader(f))
machines = list(dict.fromkeys(r["machine"] for r in rows))
fig, axes = plt.subplots(1, len(machines), figsize=(6 * len(machines), 5), squeeze=False)
for ax, machine in zip(axes[0], machines):
    mine = [r for r in rows if r["machine"] == machine]
    for split, marker in (("fit", "o"), ("held-out", "s")):
        pts = [(float(r["measured_step_seconds"]), float(r["predicted_step_seconds"])) for r in mine if r["split"] == split]
        if not pts:
            continue
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=split)
    values = [float(r[k]) for r in mine for k in ("measured_step_seconds", "predicted_step_seconds")]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    for s in (0.85, 1.15):
        ax.plot([lo, hi], [lo * s, hi * s], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step (s)")
    ax.set_ylabel("predicted step (s), memwall.perf_model")
    ax.set_title(f"{TITLES.get(machine, machine)} (dotted: ±15%)")
    ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "figure.png"), dpi=120)
