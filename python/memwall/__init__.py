"""memwall: ZeRO, ZeRO-Offload and ZeRO-Infinity in C++, from Python.

    import memwall
    memwall.estimate('zero { stage: 3 }', model=memwall.model_config(path, 'zero_100b'), ranks=64)
    trainer = memwall.Trainer(model, 'micro_batch: 8', data='data/quickstart.txt')
    trainer.step()                      # {'loss': ..., 'tokens_per_second': ..., ...}
    memwall.cpu_adam.Adam(params)       # the SIMD CPU Adam of ZeRO-Offload
    memwall.perf_model.predict(run, memwall.perf_model.load_hardware("v100_dgx2"))

Everything but perf_model is the C++ extension _memwall, re-exported here;
perf_model is Python over memwall.estimate.
"""
import os as _os
import sys as _sys

# OpenMPI loads its plugins with dlopen and needs libmpi's symbols global;
# Python loads extensions with RTLD_LOCAL. Under mpirun, load the extension
# (and so libmpi) global, as mpi4py does.
if any(k.startswith("OMPI_COMM_WORLD") for k in _os.environ):
    _flags = _sys.getdlopenflags()
    _sys.setdlopenflags(_flags | _os.RTLD_GLOBAL)
    import _memwall  # noqa: F401 (loaded global here; the names come below)
    _sys.setdlopenflags(_flags)

from _memwall import (Trainer, Zone, build_info, count_parameters, cpu_adam, dtype, estimate, forward_flops_per_token,
                      load_safetensors, model_config, model_shape, save_safetensors, workspace_dir, write_provenance,
                      zone_name)
from memwall import perf_model

__all__ = ["Trainer", "Zone", "build_info", "count_parameters", "cpu_adam", "dtype", "estimate", "forward_flops_per_token",
           "load_safetensors", "model_config", "model_shape", "perf_model", "save_safetensors", "workspace_dir",
           "write_provenance", "zone_name"]
