"""Figure for results/infinity_prefetch (ZeRO-Infinity Figure 6d): per model,
throughput without and with stage 3's overlap-centric prefetch.

usage: infinity_prefetch.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import sys

from paired_figure import draw

if __name__ == "__main__":
    draw(sys.argv[1], sys.argv[2], "+prefetch", "Overlap-centric prefetch")
