"""The SIMD, multi-threaded CPU Adam of ZeRO-Offload (cpu_adam/cpu_adam.h).

    opt = memwall.cpu_adam.AdamW([w], lr=1e-3)   # float32 numpy arrays, stepped in place
    opt.step([g])                                # float32, float16, or uint16 bf16 bits
"""
from memwall._memwall import cpu_adam as _impl

Adam = _impl.Adam
AdamW = _impl.AdamW

__all__ = ["Adam", "AdamW"]
