"""ZeRO-Offload (ATC21) §6.2.3, Figure 9, modeled (repro/modeled.py):
./bazelw run //repro:offload_dpu writes results/offload_dpu/."""
import sys

from modeled import main, model, paper, row
from memwall import perf_model


def points(hw):
    """ZeRO-Offload Figure 9: ZeRO-Offload with and without delayed parameter
    update; Table 3's batch per GPU, as the largest micro-batch our plans fit
    times accumulation."""
    rows = []
    for name, b in (("offload_1b", 32), ("offload_10b", 10)):
        for ranks in (1, 4, 16, 64, 128):
            for dpu in (False, True):
                run = perf_model.Run(model=model(name), ranks=ranks, stage=2, offload_optimizer="cpu", dpu=dpu,
                                     micro_batch=0)
                rows.append(row("ZeRO-Offload + DPU" if dpu else "ZeRO-Offload", name, run, hw,
                                global_batch=b * ranks, max_micro_batch=b))
    rows.append(paper("ZeRO-Offload + DPU", "", "", "1.12-1.59", "DPU speed-up over ZeRO-Offload"))
    return rows


if __name__ == "__main__":
    main("offload_dpu", points, "ZeRO-Offload (ATC21) §6.2.3, Figure 9",
         "ZeRO-Offload with and without delayed parameter update, 1B and 10B, 1-128 V100s",
         sys.argv[1:])
