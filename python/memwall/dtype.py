"""fp32 <-> fp16/bf16 conversions (runtime/dtype.h): 16-bit values as uint16
bit patterns, rounded to nearest even."""
from memwall._memwall import dtype as _impl

float32_to_fp16 = _impl.float32_to_fp16
float32_to_bf16 = _impl.float32_to_bf16
fp16_to_float32 = _impl.fp16_to_float32
bf16_to_float32 = _impl.bf16_to_float32

__all__ = ["bf16_to_float32", "float32_to_bf16", "float32_to_fp16", "fp16_to_float32"]
