"""ZeRO-Offload (ATC21) Table 4: memwall's CPU Adam against PyTorch's CPU
Adam, measured side by side in one process.

For each size, both optimizers get the same float32 parameters and the same
gradients each step, and use the same number of threads
(torch.set_num_threads). Steps alternate, memwall's then torch's, so that
both see the same machine state. The CSV has the median seconds per step
of each, torch's over memwall's, and the largest difference between their
parameters after the last step (both compute Adam in float32, so it stays
within a few units in the last place). The paper's rows (1B and 10B
parameters on its DGX-2's CPUs) stand beside ours as ratios. Absolute
seconds are this machine's.

  ./bazelw run //repro:offload_cpu_adam -- [--sizes=16M,64M,256M] [--steps=5] [--threads=N]

Writes out/results/offload_cpu_adam/{data.csv, figure.png, provenance.json}
(--results_dir=results for the tracked results/, or any folder).
"""
import argparse
import csv
import io
import os
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

import memwall

NAME = "offload_cpu_adam"
# ZeRO-Offload Table 4: seconds per Adam step on the DGX-2's CPUs
# (the paper's numbers).
PAPER = ((1_000_000_000, 0.22, 1.39), (10_000_000_000, 2.57, 14.76))
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8


def parse_size(text):
    units = {"K": 10**3, "M": 2**20, "G": 2**30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def import_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit("offload_cpu_adam: needs Debian's python3-torch (./bazelw installs it): %s" % e)
    return torch


def measure(n, steps, warmup, threads, torch):
    """Median seconds per step of memwall and torch for n parameters, and
    the largest parameter difference after the last step."""
    rng = np.random.default_rng(n)
    start = rng.uniform(-1, 1, n).astype(np.float32)
    grad = rng.uniform(-1, 1, n).astype(np.float32)
    mine = start.copy()
    ours = memwall.cpu_adam.Adam([mine], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, threads=threads)
    theirs_p = torch.nn.Parameter(torch.from_numpy(start.copy()))
    theirs_p.grad = torch.from_numpy(grad)  # shares the gradient's memory
    theirs = torch.optim.Adam([theirs_p], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, foreach=False)
    del start
    times = {"memwall": [], "torch": []}
    for k in range(warmup + steps):
        if k > 0:
            grad *= np.float32(-1.1)  # another gradient each step, both see it
        t0 = time.perf_counter()
        ours.step([grad])
        t1 = time.perf_counter()
        with torch.no_grad():
            theirs.step()
        t2 = time.perf_counter()
        if k >= warmup:
            times["memwall"].append(t1 - t0)
            times["torch"].append(t2 - t1)
    diff = float(np.max(np.abs(mine - theirs_p.detach().numpy())))
    return statistics.median(times["memwall"]), statistics.median(times["torch"]), diff, ours.path


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16M,64M,256M", help="parameter counts, comma-separated (K, M = 2^20, G)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per size (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both optimizers")
    parser.add_argument("--results_dir", default="",
                        help="default: <workspace>/out/results (--results_dir=results for the tracked results/)")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0 or args.steps <= 0 or args.warmup < 0 or args.threads <= 0:
        parser.error("--sizes must be > 0, --steps > 0, --warmup >= 0 and --threads > 0")
    torch = import_torch()
    torch.set_num_threads(args.threads)
    workspace = memwall.workspace_dir()
    results = memwall.user_path(args.results_dir) or os.path.join(workspace, "out", "results")
    out = os.path.join(results, NAME)
    os.makedirs(out, exist_ok=True)

    rows = []
    for n in sizes:
        mem_s, torch_s, diff, path = measure(n, args.steps, args.warmup, args.threads, torch)
        print("%12d parameters, %d threads: memwall %.4f s (%s), torch %.4f s per step: %.2fx; max |diff| %.3g"
              % (n, args.threads, mem_s, path, torch_s, torch_s / mem_s, diff), flush=True)
        for impl, s in (("memwall", mem_s), ("torch", torch_s)):
            rows.append({"params": n, "threads": args.threads, "implementation": impl, "source": "measured",
                         "seconds_per_step": "%.6f" % s, "torch_over_memwall": "%.4f" % (torch_s / mem_s),
                         "max_abs_diff": "%.3g" % diff})
    for n, mem_s, torch_s in PAPER:
        for impl, s in (("memwall", mem_s), ("torch", torch_s)):
            rows.append({"params": n, "threads": "", "implementation": "CPU-Adam" if impl == "memwall" else "PT-CPU",
                         "source": "paper (Table 4)", "seconds_per_step": "%.6f" % s,
                         "torch_over_memwall": "%.4f" % (torch_s / mem_s), "max_abs_diff": ""})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with open(os.path.join(out, "data.csv.tmp"), "w") as f:
        f.write(buf.getvalue())
    os.replace(os.path.join(out, "data.csv.tmp"), os.path.join(out, "data.csv"))

    figure = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figure.py")
    subprocess.run([sys.executable, figure, os.path.join(out, "data.csv"), os.path.join(out, "figure.png")],
                   check=True)
    memwall.write_provenance(
        os.path.join(out, "provenance.json"), experiment=NAME,
        description="memwall's CPU Adam against torch.optim.Adam (foreach=False) on the same float32 "
                    "parameters, gradients and threads, steps alternating in one process",
        paper="ZeRO-Offload (ATC21) §6.2, Table 4",
        command="./bazelw run //repro:%s -- %s" % (NAME, " ".join(shlex.quote(a) for a in argv)),
        measured_or_modeled="measured on this machine's CPU (source=measured, torch %s, %d threads, median of "
                            "%d steps after %d untimed); source=paper rows are Table 4's seconds on the DGX-2's "
                            "CPUs (the paper's numbers)" % (torch.__version__, args.threads, args.steps,
                                                                args.warmup),
        files={"data.csv": "per size: memwall's and torch's seconds per step, their ratio, the parameters' "
                           "largest difference; then the paper's rows",
               "figure.png": "drawn by repro/offload/cpu_adam/figure.py from data.csv"})
    print("wrote %s/{data.csv, figure.png, provenance.json}" % out)


if __name__ == "__main__":
    main(sys.argv[1:])
