"""results/perf_model_calibration/figure.png: predicted against measured step
seconds, fit and held-out steps apart, with the diagonal."""
import csv
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = sys.argv[1]
with open(os.path.join(out, "data.csv")) as f:
    rows = list(csv.DictReader(f))
fig, ax = plt.subplots(figsize=(6, 5))
for split, marker in (("fit", "o"), ("held-out", "s")):
    pts = [(float(r["measured_step_seconds"]), float(r["predicted_step_seconds"])) for r in rows if r["split"] == split]
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=split)
hi = max(max(float(r["measured_step_seconds"]), float(r["predicted_step_seconds"])) for r in rows) * 1.1
ax.plot([0.1, hi], [0.1, hi], "k--", lw=0.8)
for s in (0.85, 1.15):
    ax.plot([0.1, hi], [0.1 * s, hi * s], "k:", lw=0.6)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("measured step (s), CpuDevice")
ax.set_ylabel("predicted step (s), memwall.perf_model")
ax.set_title("perf model on the dev VM (dotted: ±15%)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "figure.png"), dpi=120)
