"""ZeRO-Offload (ATC21) §6.2.4, Figure 11, modeled (repro/modeled.py):
./bazelw run //repro:offload_scaling writes results/offload_scaling/."""
import sys

from modeled import main, model, paper, row
from memwall import perf_model


def points(hw):
    """ZeRO-Offload Figure 11: the 10B model on 1 to 128 GPUs, ZeRO-Offload
    against ZeRO-2 (which does not fit on few GPUs)."""
    rows = []
    for ranks in (1, 2, 4, 8, 16, 32, 64, 128):
        for series, off in (("ZeRO-Offload", "cpu"), ("ZeRO-2", "none")):
            run = perf_model.Run(model=model("offload_10b"), ranks=ranks, stage=2, offload_optimizer=off,
                                 micro_batch=0)
            rows.append(row(series, "offload_10b", run, hw, global_batch=10 * ranks, max_micro_batch=10))
    rows.append(paper("ZeRO-Offload", "offload_10b", "", 30, ">30 TFLOPS/GPU from 1 to 128 GPUs"))
    return rows


if __name__ == "__main__":
    main("offload_scaling", points, "ZeRO-Offload (ATC21) §6.2.4, Figure 11",
         "the 10B GPT on 1-128 V100s: ZeRO-Offload against ZeRO-2",
         sys.argv[1:])
