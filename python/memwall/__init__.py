"""memwall: ZeRO, ZeRO-Offload and ZeRO-Infinity in C++, from Python.

    import memwall
    model = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "positions": 64}
    memwall.estimate(model=model, ranks=2, seq=64, zero={"stage": 2})   # bytes per rank, before launching
    trainer = memwall.Trainer(model, data=memwall.QUICKSTART_TEXT, seq=64, micro_batch=8)
    trainer.step()                      # {'loss': ..., 'tokens_per_second': ..., ...}
    memwall.cpu_adam.Adam(params)       # the SIMD CPU Adam of ZeRO-Offload
    memwall.perf_model.predict(run, memwall.perf_model.load_hardware("v100_dgx2"))

Configs are text protos, dicts or keyword arguments; arrays are numpy's.
Errors: ValueError (bad input), OSError and its subclasses (files),
MemoryError (does not fit), RuntimeError (the rest). python/README.md has
the whole tour.
"""
import os as _os
import sys as _sys

__version__ = "0.1.0"

# OpenMPI loads its plugins with dlopen and needs libmpi's symbols global;
# Python loads extensions with RTLD_LOCAL. Under mpirun, load the extension
# (and so libmpi) global, as mpi4py does.
if any(k.startswith("OMPI_COMM_WORLD") for k in _os.environ):
    _flags = _sys.getdlopenflags()
    _sys.setdlopenflags(_flags | _os.RTLD_GLOBAL)
    from memwall import _memwall  # noqa: F401 (loaded global here; the names come below)
    _sys.setdlopenflags(_flags)

from memwall._memwall import (DEFAULT_REDUCE_BUCKET_BYTES, Trainer, Zone, build_info, count_parameters,
                              deepspeed_config, estimate, forward_flops_per_token, latest_checkpoint, load_safetensors, model_config,
                              model_shape, prune_checkpoints, save_safetensors, user_path, workspace_dir,
                              write_provenance, zone_name)
from memwall import cpu_adam, dtype, perf_model

# The quickstart's training text (data/quickstart.txt in the source tree).
QUICKSTART_TEXT = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "data", "quickstart.txt")

__all__ = ["DEFAULT_REDUCE_BUCKET_BYTES", "QUICKSTART_TEXT", "Trainer", "Zone", "build_info", "count_parameters", "cpu_adam",
           "deepspeed_config", "dtype", "estimate",
           "forward_flops_per_token", "latest_checkpoint", "load_safetensors", "model_config", "model_shape",
           "perf_model", "prune_checkpoints", "save_safetensors", "user_path", "workspace_dir", "write_provenance",
           "zone_name"]
