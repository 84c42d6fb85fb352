"""ZeRO (SC20) §10.3, Figure 3, modeled (repro/modeled.py):
./bazelw run //repro:zero_superlinear writes results/zero_superlinear/."""
import sys

from modeled import main, model, paper, row
from memwall import perf_model


def points(hw):
    """ZeRO Figure 3: the 60B model, P_os+g with MP 16, on 64 to 400 GPUs:
    more ranks shrink each one's model states, so the micro-batch (and with
    it the compute per byte communicated) grows."""
    rows = []
    for ranks in (64, 128, 256, 400):
        run = perf_model.Run(model=model("zero_60b"), ranks=ranks, model_parallel=16, stage=2, micro_batch=0,
                             partition_activations=True)
        # No accumulation: the batch per GPU is the point.
        rows.append(row("ZeRO-100B (stage 2, MP 16)", "zero_60b", run, hw))
    rows.append(paper("ZeRO-100B (stage 2, MP 16)", "zero_60b", 400, "", "super-linear: aggregate throughput more "
                      "than doubles when the GPUs double (values read off the figure are not in the papers' text)"))
    return rows


if __name__ == "__main__":
    main("zero_superlinear", points, "ZeRO (SC20) §10.3, Figure 3",
         "the 60B GPT on 64-400 V100s: per-GPU throughput grows with the GPUs",
         sys.argv[1:])
