"""ZeRO-Infinity (SC21) §8.2, Figure 5, modeled (repro/modeled.py):
./bazelw run //repro:infinity_scale writes results/infinity_scale/."""
import sys

from modeled import ZERO_GLOBAL_BATCH, main, model, paper, row, smallest_mp, tiled_row
from memwall import perf_model


def points(hw):
    """ZeRO-Infinity Figure 5: 512 V100s (32 DGX-2), ZeRO-Infinity with the
    optimizer states and parameters on NVMe against 3D parallelism
    (Megatron MP + ZeRO-1 data parallelism); and 1T on one DGX-2."""
    rows = []
    for name in ("infinity_0.5t", "infinity_1t", "infinity_5t", "infinity_10t", "infinity_20t"):
        rows.append(tiled_row("ZeRO-Infinity (NVMe)", name,
                              perf_model.Run(model=model(name), ranks=512, stage=3, offload_optimizer="nvme",
                                             offload_param="nvme", micro_batch=0), hw, ZERO_GLOBAL_BATCH))
        mp = smallest_mp(name, hw, 512, stage=1, mps=(1, 2, 4, 8, 16))
        if mp is None:
            rows.append(dict(series="3D parallelism (MP <= 16 + ZeRO-1)", model=name,
                             params=perf_model._params(model(name)), ranks=512, stage=1, fits="no", source="modeled",
                             note="no MP degree within a node fits"))
        else:
            rows.append(row("3D parallelism (MP <= 16 + ZeRO-1)", name,
                            perf_model.Run(model=model(name), ranks=512, model_parallel=mp, stage=1, micro_batch=0), hw,
                            note=f"MP {mp}"))
    rows.append(tiled_row("ZeRO-Infinity (NVMe), one DGX-2", "infinity_1t",
                          perf_model.Run(model=model("infinity_1t"), ranks=16, stage=3, offload_optimizer="nvme",
                                         offload_param="nvme", micro_batch=0), hw, ZERO_GLOBAL_BATCH))
    rows.append(paper("ZeRO-Infinity (NVMe)", "", "", 25000 / 512, "25 PFLOPS on 512 GPUs (49 TFLOPS/GPU)"))
    rows.append(paper("ZeRO-Infinity (NVMe), one DGX-2", "infinity_1t", perf_model._params(model("infinity_1t")), 27,
                      "1T at 27 TFLOPS/GPU on one DGX-2"))
    return rows


if __name__ == "__main__":
    main("infinity_scale", points, "ZeRO-Infinity (SC21) §8.2, Figure 5",
         "0.5T-20T GPTs on 512 V100s: ZeRO-Infinity (NVMe) against 3D parallelism; 1T on one DGX-2",
         sys.argv[1:])
