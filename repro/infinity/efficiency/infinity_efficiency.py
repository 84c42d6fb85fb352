"""ZeRO-Infinity (SC21) §4, Figure 3, modeled (repro/modeled.py):
./bazelw run //repro:infinity_efficiency writes results/infinity_efficiency/."""
import sys

from modeled import main
from memwall import perf_model


def points(hw):
    """ZeRO-Infinity Figure 3: the efficiency of a transfer with no overlap
    against its bandwidth, at the paper's 70 TFLOPS peak, for parameters and
    gradients (ait = seq·bsz), optimizer states (seq·bsz/4) and activation
    checkpoints (24·hd·ci, ci = 1): §4's formula, and memwall.perf_model's
    compute / (compute + transfer) for the same bytes and flops."""
    rows = []
    peak = 70.0
    bws = (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    for what, aits in (("parameters and gradients", [(f"seq·bsz = 1024·{b}", 1024 * b) for b in (1, 2, 4, 8, 16)]),
                       ("optimizer states", [(f"seq·bsz/4 = 1024·{b}/4", 1024 * b / 4) for b in (1, 2, 4, 8, 16)]),
                       ("activation checkpoints", [(f"24·hd, hd = {h // 1024}K", 24 * h) for h in
                                                   (2048, 8192, 32768, 65536)])):
        for label, ait in aits:
            for bw in bws:
                formula = perf_model.no_overlap_efficiency(ait, bw, peak)
                # The model's own terms: ait flops per byte of B bytes at 70 TFLOPS, B bytes at bw.
                nbytes = 1e9
                compute, transfer = ait * nbytes / (peak * 1e12), nbytes / (bw * 1e9)
                rows.append(dict(series=f"{what}: {label}", model="", x=bw, value=f"{formula:.4f}",
                                 source="paper", note="§4 formula ait·bw/(ait·bw + peak)"))
                rows.append(dict(series=f"{what}: {label}", model="", x=bw,
                                 value=f"{compute / (compute + transfer):.4f}", source="modeled",
                                 note="compute/(compute+transfer) without overlap"))
    return rows


if __name__ == "__main__":
    main("infinity_efficiency", points, "ZeRO-Infinity (SC21) §4, Figure 3",
         "efficiency against bandwidth for parameters and gradients, optimizer states and activation checkpoints "
         "at 70 TFLOPS",
         sys.argv[1:])
