"""ZeRO (SC20) §10.4, Figure 4, modeled (repro/modeled.py):
./bazelw run //repro:zero_dp_only writes results/zero_dp_only/."""
import sys

from modeled import ZERO_GLOBAL_BATCH, main, model, paper, row
from memwall import perf_model


def points(hw):
    """ZeRO Figure 4: no model parallelism, 128 GPUs; baseline DP, P_os, P_os+g."""
    rows = []
    for name in ("zero_dp_1.5b", "zero_dp_2.5b", "zero_dp_4b", "zero_dp_6b", "zero_dp_8b", "zero_dp_10b",
                 "zero_dp_11b", "zero_dp_12b", "zero_dp_13b"):
        for series, stage in (("baseline DP (stage 0)", 0), ("P_os (stage 1)", 1), ("P_os+g (stage 2)", 2)):
            rows.append(row(series, name, perf_model.Run(model=model(name), ranks=128, stage=stage, micro_batch=0),
                            hw, global_batch=ZERO_GLOBAL_BATCH))
    rows.append(paper("P_os+g (stage 2)", "zero_dp_13b", 13e9, 40, "13B on 128 GPUs at >40 TFLOPS/GPU"))
    rows.append(paper("baseline DP (stage 0)", "zero_dp_1.5b", 1.4e9, "", "largest model without ZeRO: 1.4B"))
    return rows


if __name__ == "__main__":
    main("zero_dp_only", points, "ZeRO (SC20) §10.4, Figure 4",
         "data parallelism alone on 128 V100s: which models fit and their TFLOPS at stages 0, 1, 2",
         sys.argv[1:])
