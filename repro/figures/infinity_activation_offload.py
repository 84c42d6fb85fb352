"""Figure for results/infinity_activation_offload (ZeRO-Infinity Figure 6e):
per model, throughput and device memory without and with the activation
checkpoints offloaded to pinned host memory.

usage: infinity_activation_offload.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import sys

from paired_figure import draw

if __name__ == "__main__":
    draw(sys.argv[1], sys.argv[2], "+activation-offload", "Activation checkpoint offload")
