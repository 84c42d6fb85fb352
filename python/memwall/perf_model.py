"""memwall.perf_model: step time by phase, and memory, of a ZeRO training
run on a described machine, for the runs no single machine can measure
(ZeRO's 400 GPUs, ZeRO-Offload's 128, ZeRO-Infinity's 512).

    hw = perf_model.load_hardware("v100_dgx2")
    run = perf_model.Run(model=memwall.model_config(PAPERS, "zero_100b"), ranks=400, model_parallel=16, stage=2,
                         micro_batch=8)
    p = perf_model.predict(run, hw)     # p.step_seconds, p.phases, p.tflops_per_device, p.memory (memwall.estimate's dict)

Memory is memwall.estimate's: the plans the engine allocates with, for
1/model_parallel of the parameters (Megatron-style slicing of every matrix)
and activation checkpoints 2·b·s·h·L bytes (replicated across the model
parallel group, or split across it with ZeRO-R's P_a).

Time per step and rank, Ψ parameters, P = Ψ/MP per model-parallel slice,
N data-parallel ranks, b micro-batch, s sequence, h hidden, L layers,
k = 1 with activation recomputation (checkpointing) else 0:

  compute      (3 + k)·F(s)/MP·b·s flops per micro-batch, F(s) a token's
               forward flops as the trainer counts them (memwall.
               forward_flops_per_token: 2·(12·L·h² + V·h) + 4·L·s·h), times
               the accumulation steps, at R·h/(h + h0), R the device's rate
               (Hardware.device_tflops × compute_efficiency), h0 its
               half-efficiency hidden size; forward 1/(3+k) of it,
               backward (recompute included) the rest
  DP comm      2P·(N-1)/N bytes per gradient reduction (reduce-scatter;
               stage 0's all-reduce is two), one parameter all-gather
               after the step (stages 1, 2) or one in forward and one in
               backward (stage 3); at the intra-node bandwidth when the
               group stays in a node, else at inter_node/gpus_per_node
  MP comm      2·(2 + k) all-reduces of 2·b·s·h bytes per layer,
               2·(MP-1)/MP of that over the link, not overlapped, per
               micro-batch
  optimizer    on the device: 16 bytes of state read and written per
               parameter of the shard at device_memory_gbps; offloaded:
               the CPU Adam pass, host_bytes_per_param per parameter at
               the node's cpu_memory_gbps shared by its ranks, the
               gradients (2 bytes) down and 16-bit parameters (2 bytes) up
               over PCIe, and the host's other passes over the shard:
               the gradients' accumulation into the host buffer and the
               global norm (grad_accumulate_bytes_per_param and
               grad_norm_bytes_per_param at the same bandwidth); NVMe:
               12 bytes of fp32 states a parameter read in at nvme_gbps
               while the sub-group before goes back out at
               nvme_write_gbps (each shared by the node's ranks; the
               slower direction sets the time), pipelined with the CPU
               Adam; with the gradients on NVMe too, the 16-bit shard
               written under the backward pass (read and written again by
               each further micro-batch) and read once under the CPU Adam
  parameters   stage 3: each pass (forward, recompute, backward) fetches
               the rank's 2P/N bytes of 16-bit parameters into the gather
               buffer, then all-gathers them: on the device, a copy (read
               and written) at device_memory_gbps; offloaded
               (ZeRO-Infinity), over its own PCIe (and from NVMe first;
               bandwidth-centric partitioning)

Overlap, as the engine schedules it (and an H100's traces show it: commit
0aaa5c3's results/offload_dpu_gpu/traces/, and the zones of 60787c5's
results/offload_dpu_gpu/run.log): the gradient reduction and the
gradients' copy down run under the backward pass, stage 3's gathers and
the parameter fetches under the pass they feed (prefetch), the NVMe
optimizer swap under the CPU Adam (the tile pipeline). The host
accumulates the gradients a reduce bucket at a time as the backward pass
fills them, a two-stage pipeline:

  backward = max(backward pass, accumulation)
             + min(backward pass, accumulation) · bucket / shard

The norm and the optimizer run after the backward pass, the parameters'
copy up under the CPU Adam (the tile pipeline):

  step = passes + norm + max(optimizer, copy up)
  step = max(passes, optimizer + accumulation)       with the delayed
         + norm + copy up                            parameter update
                                                     (the update and the
                                                     next accumulation share
                                                     the host)

(ZeRO-Offload §5.2: the update of the step before runs under this step's
forward and backward; its parameters go up after them). A machine whose
"device" shares the host's cores (the CpuDevice, Hardware.shares_cores)
overlaps nothing that takes a core: its step is the phases' sum, but for
the NVMe optimizer swap, which the drive's DMA runs under the CPU Adam
(io_uring takes no core):

  step = sum of the phases - min(CPU Adam, NVMe optimizer swap)
"""
import dataclasses
import functools
import json
import math
import os
import typing
from typing import Dict, Optional

from memwall import _memwall

GB = 1e9
# The trainer's zone names (runtime/timeline.h), the keys of measured
# breakdowns and of the phases that have a zone of their own.
FORWARD_BACKWARD = _memwall.zone_name(_memwall.Zone.FORWARD_BACKWARD)
ADAM = _memwall.zone_name(_memwall.Zone.ADAM)
CPU_ADAM = _memwall.zone_name(_memwall.Zone.CPU_ADAM)
GRAD_ACCUMULATE = _memwall.zone_name(_memwall.Zone.GRAD_ACCUMULATE)
GRAD_NORM = _memwall.zone_name(_memwall.Zone.GRAD_NORM)
GRAD_D2H = _memwall.zone_name(_memwall.Zone.GRAD_D2H)
PARAM_H2D = _memwall.zone_name(_memwall.Zone.PARAM_H2D)

_HARDWARE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hardware")

# The CPU Adam's traffic per parameter: fp32 parameter, momentum and
# variance read and written (24), a 16-bit gradient read (2) and the 16-bit
# parameter written for the copy up (2).
CPU_ADAM_BYTES_PER_PARAM = 28
# Device Adam (no offload): the same pass in device memory, and the
# 16-bit gradient and parameter.
DEVICE_ADAM_BYTES_PER_PARAM = 28
# NVMe optimizer swap, a step's traffic each way: the fp32 parameter,
# momentum and variance (12 bytes) read in, and the same written back
# (ZeRO-Infinity §5.2; infinity/nvme_state_store.h). The two directions run
# at once: the store reads the next sub-group while the one before is
# written (the dev VM's 40B step: 17 GB in over 14.5 s, 17 GB out over 8.9
# s, both within its 15.6 s optimizer zone).
NVME_OPTIMIZER_BYTES_PER_PARAM = 12
# The 16-bit gradient shard on NVMe (infinity/nvme_gradient_shard.h):
# written by the first micro-batch, read and written by each further one,
# read by the optimizer.
NVME_GRADIENT_BYTES_PER_PARAM = 2


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One machine type. Bandwidths in GB/s (1e9 bytes), one direction.
    Made from a file or in code, a field of the wrong type, not finite or
    out of range is a ValueError naming it."""
    name: str
    gpus_per_node: int
    device_memory_bytes: int
    device_tflops: float          # dense 16-bit GEMM peak per device (datasheet)
    compute_efficiency: float     # share of device_tflops a training step's math reaches at large hidden
    half_hidden: float            # h0: the hidden size (per model-parallel slice) at half that efficiency
    device_memory_gbps: float     # per device
    pcie_gbps: float              # host <-> device, per device
    intra_node_gbps: float        # collective bus bandwidth per device inside a node
    inter_node_gbps: float        # per node, all its NICs together
    nvme_gbps: float              # per node, all its drives together, reading
    cpu_memory_gbps: float        # per node, what a streaming pass reaches
    host_bytes_per_param: float = CPU_ADAM_BYTES_PER_PARAM  # host traffic of the offloaded optimizer step
    # The offloaded step's other host passes, per parameter of the shard
    # at cpu_memory_gbps (0: not modeled, as in the papers' machines):
    grad_accumulate_bytes_per_param: float = 0.0  # gradients into the host buffer, under the backward pass
    grad_norm_bytes_per_param: float = 0.0        # the global norm's pass, after the backward pass
    nvme_write_gbps: float = 0.0  # per node, writing while it reads (0: nvme_gbps)
    cpu_cores: int = 0            # per node (documentation)
    host_memory_bytes: int = 0    # per node
    shares_cores: bool = False    # the "device" runs on the host's cores: nothing overlaps
    source: str = ""              # where each number comes from

    def __post_init__(self):
        _check_fields(self, _MAY_BE_ZERO)

    @property
    def compute_flops(self) -> float:
        return self.device_tflops * 1e12 * self.compute_efficiency


# Hardware's fields where 0 means none (or "the read rate"; half_hidden 0:
# the efficiency does not depend on the hidden size); every other number
# must be > 0.
_MAY_BE_ZERO = ("cpu_cores", "host_memory_bytes", "grad_accumulate_bytes_per_param", "grad_norm_bytes_per_param",
                "nvme_write_gbps", "half_hidden")


def _check_fields(obj, may_be_zero=(), at_least_one=()):
    """Each field of the dataclass `obj` of its annotated type (an int
    where int, a number where float, never a bool for either; None where
    Optional), every number finite and > 0, or >= 0 for `may_be_zero`, >= 1
    for `at_least_one`: else a ValueError naming the field."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        kind = f.type
        if typing.get_origin(kind) is typing.Union:  # Optional[X]
            if v is None:
                continue
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if kind in (str, bool):
            if not isinstance(v, kind):
                raise ValueError(f"{f.name} must be a {kind.__name__}, got {v!r}")
            continue
        number = isinstance(v, int) if kind is int else isinstance(v, (int, float))
        if isinstance(v, bool) or not number:
            raise ValueError(f"{f.name} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"{f.name} must be a finite number, got {v}")
        low, bound = ((0, ">= 0") if f.name in may_be_zero else (1, ">= 1") if f.name in at_least_one
                      else (None, "> 0"))
        if v < low if low is not None else v <= 0:
            raise ValueError(f"{f.name} must be {bound}, got {v}")


def load_hardware(name_or_path: str) -> Hardware:
    """A Hardware from python/memwall/hardware/<name>.json or a JSON file path;
    a missing or unknown field is a ValueError naming it."""
    path = name_or_path if name_or_path.endswith(".json") else os.path.join(_HARDWARE_DIR, name_or_path + ".json")
    try:
        with open(path) as f:
            fields = json.load(f)
    except OSError as e:
        known = sorted(n[:-5] for n in os.listdir(_HARDWARE_DIR) if n.endswith(".json"))
        raise ValueError(f"hardware '{name_or_path}': cannot read {path} ({e.strerror}); known: {', '.join(known)}")
    except json.JSONDecodeError as e:
        raise ValueError(f"hardware file {path}: not JSON: {e}")
    if not isinstance(fields, dict):
        raise ValueError(f"hardware file {path}: not a JSON object")
    names = {f.name for f in dataclasses.fields(Hardware)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"hardware file {path}: unknown field(s) {', '.join(unknown)}")
    try:
        return Hardware(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"hardware file {path}: {e}")


@dataclasses.dataclass(frozen=True)
class Run:
    """A training run: the model (a GptConfig text proto, see memwall.model_config)
    and its ZeRO settings. ranks = every device (data x model parallel).
    predict and memory refuse a field of the wrong type or out of range,
    and settings that do not go together, with a ValueError naming them."""
    model: str
    ranks: int = 1
    model_parallel: int = 1
    stage: int = 0
    offload_optimizer: str = "none"   # none, cpu, nvme
    offload_param: str = "none"       # none, cpu, nvme (stage 3)
    dpu: bool = False                 # delayed parameter update (offload_optimizer)
    dpu_values_on_device: bool = False  # its 16-bit result waits on the device, copied up as made
    gradients_on_nvme: bool = False   # the 16-bit gradient shard on NVMe too (offload_optimizer nvme)
    micro_batch: int = 1
    accumulation: int = 1             # micro-batches per step per rank (one reduction and update per step)
    seq: Optional[int] = None         # default: the model's positions
    checkpointing: Optional[bool] = None  # default: the model's setting
    prefetch: bool = True             # overlap-centric prefetch of offloaded parameters
    reduce_bucket_bytes: Optional[int] = None  # default: the trainer's (DEFAULT_REDUCE_BUCKET_BYTES)
    partition_activations: bool = False  # ZeRO-R's P_a: activation checkpoints split across the MP group

    @property
    def data_parallel(self) -> int:
        return self.ranks // self.model_parallel


# Run's offload devices, as the trainer's config names them.
_OFFLOAD_DEVICES = {"none": "", "cpu": "CPU", "nvme": "NVME"}
# Run's counts; predict refuses a value below 1 (a Run may hold micro_batch 0
# while a caller searches for the largest that fits, largest_micro_batch).
_RUN_COUNTS = ("ranks", "model_parallel", "micro_batch", "accumulation", "seq", "reduce_bucket_bytes")


@dataclasses.dataclass
class Prediction:
    step_seconds: float
    phases: Dict[str, float]            # seconds each phase takes alone
    visible: Dict[str, float]           # seconds each phase adds to the step (after overlap)
    flops_per_device: float
    tflops_per_device: float            # model flops (recompute counted) / step time
    memory: dict                        # memwall.estimate's dict for one rank
    fits: bool
    params: int


@functools.lru_cache(maxsize=256)
def _shape(model: str) -> dict:
    """The model's sizes, read by the engine (memwall.model_shape)."""
    return _memwall.model_shape(model)


def _field(model: str, name: str) -> int:
    return int(_shape(model)[name])


def _step_flops(run: Run, seq: int) -> float:
    """A micro-batch's flops on one model-parallel slice: forward, backward
    (2 forwards) and, with checkpointing, the recompute."""
    k = 1 if _checkpointing(run) else 0
    return (3 + k) * _memwall.forward_flops_per_token(run.model, seq) / run.model_parallel * run.micro_batch * seq


def _training_config(run: Run, seq: int) -> str:
    zero = f"stage: {run.stage}"
    if run.reduce_bucket_bytes:
        zero += f" reduce_bucket_bytes: {run.reduce_bucket_bytes}"
    for what, v in (("offload_optimizer", run.offload_optimizer), ("offload_param", run.offload_param)):
        if v != "none":
            path = " nvme_path: '/nvme'" if v == "nvme" else ""
            # The delayed update holds its 16-bit result whole (2 bytes a
            # parameter), on the host or on the device.
            delayed = ""
            if run.dpu and what == "offload_optimizer":
                delayed = " delayed_update_after_steps: 1"
                if run.dpu_values_on_device:
                    delayed += " delayed_values_on_device: true"
            if run.gradients_on_nvme and what == "offload_optimizer":
                delayed += " gradients_on_nvme: true"
            zero += f" {what} {{ device: {_OFFLOAD_DEVICES[v]}{path}{delayed} }}"
    return (f"seq: {seq} micro_batch: {run.micro_batch} accumulation: {run.accumulation} precision: BF16 "
            f"zero {{ {zero} }}")


def memory(run: Run, hw: Optional[Hardware] = None) -> dict:
    """memwall.estimate for one rank of `run` (model-parallel slice of the
    parameters; checked against hw's device memory when given). The host's
    memory is not checked: the estimator plans more host memory for
    ZeRO-Infinity's NVMe runs than the papers' DGX-2 has per GPU (96 GiB),
    where the papers trained them."""
    _check_run(run)
    seq = run.seq or _field(run.model, "positions")
    config = _training_config(run, seq)
    budget = hw.device_memory_bytes if hw else 0
    if run.model_parallel == 1:
        return _memwall.estimate(config, model=run.model, ranks=run.data_parallel, checkpointing=run.checkpointing,
                                 device_bytes=budget)
    # Model states of the slice from the engine's plans; activation
    # checkpoints (the layer inputs, whole on every slice) by their formula.
    est = _memwall.estimate(config, params=_params(run.model) // run.model_parallel, ranks=run.data_parallel,
                            device_bytes=budget)
    if not _checkpointing(run):
        raise ValueError("model_parallel > 1 is modeled with activation checkpointing only "
                         "(a sliced layer's full activations are not planned)")
    h, layers = _field(run.model, "hidden"), _field(run.model, "layers")
    acts = 2 * run.micro_batch * seq * h * layers
    if run.partition_activations:
        acts //= run.model_parallel
    est = dict(est)
    est["activation_bytes_per_rank_formula"] = acts
    est["total_device_bytes_per_rank"] += acts
    est["activations_counted"] = True
    if budget:
        est["fits_device"] = est["total_device_bytes_per_rank"] <= budget
        est["fits"] = est["fits_device"] and est["fits_host"] and est["fits_disk"]
    return est


def _checkpointing(run: Run) -> bool:
    if run.checkpointing is not None:
        return run.checkpointing
    return bool(_shape(run.model)["activation_checkpointing"])


def _params(model: str) -> int:
    """Ψ of a GPT, as the engine counts it (models::CountParameters)."""
    return _memwall.count_parameters(model)


def _check_run(run: Run):
    """A ValueError naming what `run` sets wrong: a field's type or range, or
    settings that do not go together."""
    try:
        _check_fields(run, may_be_zero=("stage",), at_least_one=_RUN_COUNTS)
    except ValueError as e:
        raise ValueError(f"Run: {e}")
    for what, v in (("offload_optimizer", run.offload_optimizer), ("offload_param", run.offload_param)):
        if v not in _OFFLOAD_DEVICES:
            raise ValueError(f"{what} '{v}' is not {', '.join(_OFFLOAD_DEVICES)}")
    if run.ranks % run.model_parallel:
        raise ValueError(f"ranks {run.ranks} is not a multiple of model_parallel {run.model_parallel}")
    if run.stage not in (0, 1, 2, 3):
        raise ValueError(f"stage {run.stage} is not 0-3")
    if run.offload_param != "none" and run.stage != 3:
        raise ValueError("offload_param needs stage 3")
    if run.dpu and run.offload_optimizer == "none":
        raise ValueError("dpu needs offload_optimizer")
    if run.dpu_values_on_device and not run.dpu:
        raise ValueError("dpu_values_on_device needs dpu")
    if run.gradients_on_nvme and (run.offload_optimizer != "nvme" or run.dpu):
        raise ValueError("gradients_on_nvme needs offload_optimizer nvme and no dpu")


def predict(run: Run, hw: Hardware, with_memory: bool = True) -> Prediction:
    """Step time by phase and memory of one rank of `run` on `hw` (see the module's docstring for the formulas)."""
    _check_run(run)
    seq = run.seq or _field(run.model, "positions")
    L, h = _field(run.model, "layers"), _field(run.model, "hidden")
    k = 1 if _checkpointing(run) else 0
    psi = _params(run.model)
    mp, n, b = run.model_parallel, run.data_parallel, run.micro_batch
    slice_params = psi / mp
    shard = slice_params / n if run.stage >= 1 else slice_params  # parameters whose optimizer step this rank runs
    per_node = min(run.ranks, hw.gpus_per_node)

    ga = run.accumulation
    flops = _step_flops(run, seq) * ga
    rate = hw.compute_flops * h / (h + hw.half_hidden)
    compute = flops / rate
    fwd, bwd = compute / (3 + k), compute * (2 + k) / (3 + k)

    # Data-parallel collectives: the group spans nodes when data x model
    # parallel ranks exceed a node.
    dp_bw = hw.intra_node_gbps if run.ranks <= hw.gpus_per_node else min(hw.intra_node_gbps, hw.inter_node_gbps / hw.gpus_per_node)
    one = 2 * slice_params * (n - 1) / n / (dp_bw * GB) if n > 1 else 0.0  # one reduce-scatter or all-gather
    grad_reduce = 2 * one if run.stage == 0 else one
    gather_after = one if run.stage in (1, 2) else 0.0
    gather_fwd = one if run.stage == 3 else 0.0
    gather_bwd = one if run.stage == 3 else 0.0
    mp_bw = hw.intra_node_gbps if mp <= hw.gpus_per_node else hw.inter_node_gbps / hw.gpus_per_node
    mp_comm = ga * L * 2 * (2 + k) * 2 * b * seq * h * 2 * (mp - 1) / mp / (mp_bw * GB) if mp > 1 else 0.0

    pcie = hw.pcie_gbps * GB
    nvme_rank = hw.nvme_gbps * GB / per_node
    nvme_write_rank = (hw.nvme_write_gbps or hw.nvme_gbps) * GB / per_node

    def nvme(read_bytes, write_bytes):  # both directions at once
        return max(read_bytes / nvme_rank, write_bytes / nvme_write_rank)

    cpu_rank = hw.cpu_memory_gbps * GB / per_node
    opt_device = opt_cpu = opt_nvme = grads_down = params_up = accumulate = norm = grad_nvme = 0.0
    if run.offload_optimizer == "none":
        opt_device = shard * DEVICE_ADAM_BYTES_PER_PARAM / (hw.device_memory_gbps * GB)
    else:
        opt_cpu = shard * hw.host_bytes_per_param / cpu_rank
        accumulate = ga * shard * hw.grad_accumulate_bytes_per_param / cpu_rank
        norm = shard * hw.grad_norm_bytes_per_param / cpu_rank
        grads_down = 2 * shard / pcie
        params_up = 2 * shard / pcie
        if run.offload_optimizer == "nvme":
            states = shard * NVME_OPTIMIZER_BYTES_PER_PARAM
            opt_nvme = nvme(states, states)
            if run.gradients_on_nvme:
                grads = shard * NVME_GRADIENT_BYTES_PER_PARAM
                grad_nvme = nvme((ga - 1) * grads, ga * grads)
                opt_nvme = nvme(states + grads, states)

    fetch_pass = nvme_pass = 0.0   # stage 3's parameters, per pass
    if run.offload_param != "none":
        fetch_pass = 2 * slice_params / n / pcie
        if run.offload_param == "nvme":
            nvme_pass = 2 * slice_params / n / nvme_rank
    elif run.stage == 3:
        fetch_pass = 2 * 2 * slice_params / n / (hw.device_memory_gbps * GB)
    passes_bwd = (1 + k) * ga
    fetch_fwd, nvme_fwd = fetch_pass * ga, nvme_pass * ga

    phases = {
        FORWARD_BACKWARD: compute,
        "dp_reduce": grad_reduce,
        "dp_gather": gather_after + gather_fwd + gather_bwd,
        "mp_allreduce": mp_comm,
        "adam_device": opt_device,
        CPU_ADAM: opt_cpu,
        "nvme_optimizer": opt_nvme,
        "grads_nvme": grad_nvme,
        "grads_down": grads_down,
        GRAD_ACCUMULATE: accumulate,
        GRAD_NORM: norm,
        "params_up": params_up,
        "param_fetch": fetch_pass * ga + fetch_pass * passes_bwd,
        "param_nvme": nvme_pass * ga + nvme_pass * passes_bwd,
    }
    if hw.shares_cores:
        visible = dict(phases)
        visible["nvme_optimizer"] = max(0.0, opt_nvme - opt_cpu)  # the drive's, under the CPU Adam
        step = sum(visible.values())
    else:
        over = (lambda *t: max(t)) if run.prefetch else (lambda *t: sum(t))
        forward = over(fwd, gather_fwd * ga, fetch_fwd, nvme_fwd)
        backward = max(over(bwd, gather_bwd * ga, fetch_pass * passes_bwd, nvme_pass * passes_bwd), grad_reduce,
                       grads_down, accumulate, grad_nvme)
        if accumulate:
            # The host accumulates the gradients a reduce bucket at a time
            # (2 bytes a gradient) as the backward pass fills them: a
            # two-stage pipeline, the slower stage plus one bucket of the other.
            bucket = (run.reduce_bucket_bytes or _memwall.DEFAULT_REDUCE_BUCKET_BYTES) / 2
            backward += min(bwd, accumulate / ga) * min(1.0, bucket / shard)
        passes = forward + backward + mp_comm
        host_update = opt_device + max(opt_cpu, opt_nvme)
        if run.dpu:
            # The update of the step before runs under this step's passes,
            # on the host beside this step's gradient accumulation: the two
            # share its memory bandwidth. The norm, then the parameters'
            # copy up, wait for both.
            host_busy = host_update + accumulate
            if run.dpu_values_on_device:
                # Each tile goes up as the delayed Adam makes it.
                host_busy = max(host_busy, params_up)
            hidden = min(host_busy, passes)
            after = host_busy - hidden + (0 if run.dpu_values_on_device else params_up) + gather_after
        else:
            # The tile pipeline copies each tile up as the CPU Adam ends it.
            after = max(host_update, params_up) + gather_after
        step = passes + norm + after
        visible = {"forward": forward, "backward": backward, "mp_allreduce": mp_comm, GRAD_NORM: norm,
                   "optimizer": after}
    mem = memory(run, hw) if with_memory else {}
    return Prediction(step_seconds=step, phases=phases, visible=visible, flops_per_device=flops,
                      tflops_per_device=flops / step / 1e12, memory=mem, fits=bool(mem.get("fits", True)), params=psi)


def largest_micro_batch(run: Run, hw: Hardware, candidates=(1, 2, 4, 8, 16, 32, 64)) -> Optional[int]:
    """The largest micro-batch of `candidates` whose estimate fits hw's device memory, or None."""
    best = None
    for b in candidates:
        if memory(dataclasses.replace(run, micro_batch=b), hw)["fits"]:
            best = b
        else:
            break
    return best


def no_overlap_efficiency(ait: float, bandwidth_gbps: float, peak_tflops: float) -> float:
    """ZeRO-Infinity §4's efficiency of a transfer at arithmetic intensity
    `ait` (flops per byte moved) over `bandwidth_gbps` with no overlap:
    compute / (compute + transfer) = ait·bw / (ait·bw + peak)."""
    bw = bandwidth_gbps * GB
    return ait * bw / (ait * bw + peak_tflops * 1e12)


def _run_flops(run: Run) -> float:
    return _step_flops(run, run.seq or _field(run.model, "positions"))


def _shard(run: Run) -> float:
    """Parameters whose optimizer step one rank runs."""
    return _params(run.model) / (run.data_parallel if run.stage >= 1 else 1)


def bytes_per_second(pairs, what: str) -> float:
    """The rate through the origin that best fits (bytes, seconds) pairs:
    sum(bytes·t) / sum(t²); a ValueError naming `what` without pairs."""
    if not pairs:
        raise ValueError(f"calibration: no row measures {what}")
    return sum(b * t for b, t in pairs) / sum(t * t for b, t in pairs)


def calibrate(rows, nvme_gbps: float, nvme_write_gbps: float = 0.0, name: str = "calibrated") -> Hardware:
    """A shares_cores Hardware (a CpuDevice machine) fitted to measured steps.

    rows: dicts with "run" (a Run) and "zones" (seconds per step of the
    trainer's timeline zones, by memwall.zone_name: FORWARD_BACKWARD, ADAM,
    CPU_ADAM, GRAD_ACCUMULATE, GRAD_NORM, GRAD_D2H, PARAM_H2D). Fitted:
    the compute rate R and half-efficiency hidden h0 by least squares on
    seconds/flop = 1/R + (h0/R)/h; the device Adam's and the CPU Adam's
    bandwidth from their zones at 28 bytes per parameter; the host's bytes
    per parameter from every host pass of the offloaded step (CPU Adam,
    gradient accumulation, norm) at that bandwidth; the copies' bandwidth
    from the gradient and parameter copies. nvme_gbps and nvme_write_gbps
    are measured apart (the aio benchmark's fio baseline)."""
    import numpy as np

    xs, ys = [], []
    for r in rows:
        xs.append([1.0, 1.0 / _field(r["run"].model, "hidden")])
        ys.append(r["zones"][FORWARD_BACKWARD] / _run_flops(r["run"]))
    (a, c), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
    if a <= 0:
        raise ValueError("calibration: forward+backward times do not fall with the hidden size as the model assumes")

    device = bytes_per_second([(_shard(r["run"]) * DEVICE_ADAM_BYTES_PER_PARAM, r["zones"][ADAM])
                               for r in rows if ADAM in r["zones"]], "the device Adam")
    offloaded = [r for r in rows if CPU_ADAM in r["zones"]]
    cpu = bytes_per_second([(_shard(r["run"]) * CPU_ADAM_BYTES_PER_PARAM, r["zones"][CPU_ADAM]) for r in offloaded],
                           "the CPU Adam")
    host = [(sum(r["zones"].get(z, 0.0) for z in (CPU_ADAM, GRAD_ACCUMULATE, GRAD_NORM)), _shard(r["run"]))
            for r in offloaded]
    host_bytes = cpu * sum(t * p for t, p in host) / sum(p * p for t, p in host)
    copies = bytes_per_second([(2 * _shard(r["run"]), r["zones"][z]) for r in offloaded for z in (GRAD_D2H, PARAM_H2D)],
                              "the copies over PCIe")
    return Hardware(name=name, gpus_per_node=1, device_memory_bytes=1 << 40, device_tflops=1 / a / 1e12,
                    compute_efficiency=1.0, half_hidden=max(c / a, 1.0), device_memory_gbps=device / GB,
                    pcie_gbps=copies / GB, intra_node_gbps=copies / GB, inter_node_gbps=copies / GB,
                    nvme_gbps=nvme_gbps, nvme_write_gbps=nvme_write_gbps, cpu_memory_gbps=cpu / GB, host_bytes_per_param=host_bytes,
                    shares_cores=True, source="fitted by memwall.perf_model.calibrate to CpuDevice measurements")


def calibrate_device(rows, base: Hardware, name: str) -> Hardware:
    """`base` (a GPU machine: its datasheet and layout) with the rates its
    measured steps show; nothing is shared (the device and the host overlap).

    rows: as calibrate's, from one rank on the machine's one GPU, each with
    "delayed" (whether the row's mode ran the delayed parameter update).
    Fitted: the compute rate as compute_efficiency of base.device_tflops
    and, where the rows span two or more hidden sizes, h0 (least squares on
    seconds/flop = 1/R + (h0/R)/h; one hidden size keeps base's h0), from
    the rows that offload nothing where there are any (an offloaded
    step's backward waits on the host's gradient accumulation); the
    device Adam's bandwidth (device_memory_gbps) and the CPU Adam's
    (cpu_memory_gbps) at 28 bytes per parameter, from the undelayed rows
    where there are any (the delayed Adam shares the host with the next
    gradient accumulation); the gradient accumulation's
    and the norm's bytes per parameter at the CPU Adam's bandwidth; PCIe
    from the gradients' copy down and the delayed update's parameter copy up
    (the undelayed copy up runs tile by tile under the CPU Adam, which
    paces it). The rest is base's."""
    import numpy as np

    passes = [r for r in rows if CPU_ADAM not in r["zones"]] or rows
    hiddens = sorted({_field(r["run"].model, "hidden") for r in passes})
    if len(hiddens) >= 2:
        xs = [[1.0, 1.0 / _field(r["run"].model, "hidden")] for r in passes]
        ys = [r["zones"][FORWARD_BACKWARD] / _run_flops(r["run"]) for r in passes]
        (a, c), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
        if a <= 0 or c < 0:
            raise ValueError("calibration: forward+backward times do not fall with the hidden size as the model assumes")
        rate_flops, h0 = 1 / a, c / a
    else:
        h0 = base.half_hidden
        h = hiddens[0]
        rate_flops = (sum(_run_flops(r["run"]) * (h + h0) / h for r in passes)
                      / sum(r["zones"][FORWARD_BACKWARD] for r in passes))

    def per_param(zone, bandwidth, rows_):  # bytes per parameter of `zone` at `bandwidth`
        pairs = [(r["zones"][zone], _shard(r["run"])) for r in rows_ if zone in r["zones"]]
        return bandwidth * sum(t * p for t, p in pairs) / sum(p * p for t, p in pairs) if pairs else 0.0

    device_adam = [(_shard(r["run"]) * DEVICE_ADAM_BYTES_PER_PARAM, r["zones"][ADAM]) for r in rows if ADAM in r["zones"]]
    device_gbps = bytes_per_second(device_adam, "the device Adam") / GB if device_adam else base.device_memory_gbps
    offloaded = [r for r in rows if CPU_ADAM in r["zones"]]
    alone = [r for r in offloaded if not r["delayed"]] or offloaded  # the delayed Adam shares the host
    cpu = bytes_per_second([(_shard(r["run"]) * CPU_ADAM_BYTES_PER_PARAM, r["zones"][CPU_ADAM]) for r in alone],
                           "the CPU Adam")
    copies = [(2 * _shard(r["run"]), r["zones"][GRAD_D2H]) for r in offloaded if GRAD_D2H in r["zones"]]
    copies += [(2 * _shard(r["run"]), r["zones"][PARAM_H2D]) for r in offloaded if r["delayed"] and PARAM_H2D in r["zones"]]
    pcie = bytes_per_second(copies, "the copies over PCIe")
    return dataclasses.replace(
        base, name=name, compute_efficiency=rate_flops / (base.device_tflops * 1e12), half_hidden=max(h0, 1.0),
        device_memory_gbps=device_gbps, cpu_memory_gbps=cpu / GB, host_bytes_per_param=CPU_ADAM_BYTES_PER_PARAM,
        grad_accumulate_bytes_per_param=per_param(GRAD_ACCUMULATE, cpu, offloaded),
        grad_norm_bytes_per_param=per_param(GRAD_NORM, cpu, offloaded), pcie_gbps=pcie / GB, shares_cores=False)


# The fields calibrate_device fits; a machine's file holds them as its
# calibration wrote them (//repro:perf_model_calibration).
DEVICE_FITTED_FIELDS = ("compute_efficiency", "half_hidden", "device_memory_gbps", "cpu_memory_gbps",
                        "grad_accumulate_bytes_per_param", "grad_norm_bytes_per_param", "pcie_gbps")
