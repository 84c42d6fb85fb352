"""Figure for results/infinity_activation_offload (ZeRO-Infinity Figure 6e):
per model, throughput and device memory without and with the activation
checkpoints offloaded to pinned host memory.

usage: figure.py DATA.csv OUT.png  (reads summary.csv beside DATA.csv)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # repro/
from paired_figure import draw  # noqa: E402

if __name__ == "__main__":
    draw(sys.argv[1], sys.argv[2], "+activation-offload", "Activation checkpoint offload")
