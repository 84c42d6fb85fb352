"""ZeRO (SC20) §10.2, Figure 2, modeled (repro/modeled.py):
./bazelw run //repro:zero_throughput writes results/zero_throughput/."""
import sys

from modeled import ZERO_GLOBAL_BATCH, main, model, paper, row
from memwall import perf_model


def points(hw):
    """ZeRO Figure 2: 400 V100s; ZeRO-100B (P_os+g with ZeRO-R's partitioned
    activation checkpoints, MP within a node) against the baseline (Megatron
    MP, stage 0), each at its smallest fitting MP."""
    rows = []
    for name in ("zero_1.5b", "zero_8b", "zero_20b", "zero_40b", "zero_60b", "zero_80b", "zero_100b", "zero_120b",
                 "zero_140b", "zero_170b"):
        for series, stage, mps in (("ZeRO-100B (stage 2)", 2, (1, 2, 4, 8, 16)),
                                   ("baseline Megatron MP (stage 0)", 0, (1, 2, 4, 8, 16, 32, 64))):
            ranks = 400
            mp = None
            for m in mps:
                r = ranks - ranks % m
                if perf_model.memory(perf_model.Run(model=model(name), ranks=r, model_parallel=m, stage=stage,
                                                    micro_batch=1), hw)["fits"]:
                    mp, ranks = m, r
                    break
            if mp is None:
                rows.append(dict(series=series, model=name, ranks=ranks, stage=stage, fits="no", source="modeled",
                                 note=f"no MP degree of {mps} fits"))
                continue
            run = perf_model.Run(model=model(name), ranks=ranks, model_parallel=mp, stage=stage, micro_batch=0,
                                 partition_activations=stage == 2)
            rows.append(row(series, name, run, hw, note=f"smallest fitting MP {mp}", global_batch=ZERO_GLOBAL_BATCH))
    rows.append(paper("ZeRO-100B (stage 2)", "zero_100b", 100e9, 38, "TFLOPS/GPU: 100B on 400 GPUs at >38, 15 PFLOPS"))
    rows.append(paper("ZeRO-100B (stage 2)", "zero_100b", 100e9, 15000 / 400, "15 PFLOPS aggregate / 400 GPUs"))
    return rows


if __name__ == "__main__":
    main("zero_throughput", points, "ZeRO (SC20) §10.2, Figure 2",
         "TFLOPS per GPU of 1.5B-170B GPTs on 400 V100s: ZeRO-100B (stage 2) against Megatron MP",
         sys.argv[1:])
