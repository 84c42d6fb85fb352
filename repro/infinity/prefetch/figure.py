"""Figure for results/infinity_prefetch (ZeRO-Infinity Figure 6d): per model,
throughput without and with stage 3's overlap-centric prefetch.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # repro/
from paired_figure import draw  # noqa: E402

if __name__ == "__main__":
    draw(sys.argv[1], sys.argv[2], "+prefetch", "Overlap-centric prefetch")
