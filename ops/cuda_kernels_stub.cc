// ops/ CUDA launchers in a build without CUDA: each reports so.
#include "ops/cuda_kernels.h"

namespace memwall::ops::cuda {

const char* ErrorString(int) { return "memwall was built without CUDA"; }
int LoadCublas() { return kNotBuiltWithCuda; }
int Gemm(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*, int64_t,
         Elem, float, void*, int64_t, Elem, const void*, Elem, void*) {
  return kNotBuiltWithCuda;
}
int GeluForward(const void*, void*, Elem, int64_t, void*) { return kNotBuiltWithCuda; }
int GeluBackward(const void*, const void*, void*, Elem, int64_t, void*) { return kNotBuiltWithCuda; }
int Add(const void*, const void*, void*, Elem, int64_t, void*) { return kNotBuiltWithCuda; }
int LayerNormForward(const void*, const void*, void*, const void*, const void*, Elem, Elem, float, void*,
                     float*, float*, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int LayerNormBackward(const void*, const void*, const void*, const float*, const float*, void*,
                      void*, void*, Elem, Elem, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}

int SoftmaxCrossEntropy(void*, const int32_t*, float*, float, Elem, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}

int EmbeddingForward(const int32_t*, const void*, Elem, void*, Elem, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int EmbeddingBackward(const int32_t*, const void*, Elem, void*, Elem, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int CopyColumns(const void*, int64_t, void*, int64_t, int64_t, int64_t, void*) { return kNotBuiltWithCuda; }
int AddBias(void*, Elem, const void*, Elem, int64_t, int64_t, void*) { return kNotBuiltWithCuda; }
int BiasBackward(const void*, Elem, void*, Elem, int64_t, int64_t, void*) { return kNotBuiltWithCuda; }
int AttentionForward(const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int AttentionBackward(const float*, const float*, const float*, const float*, float*, float*,
                      int64_t, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
bool TensorCoreAttention(int64_t) { return false; }
int AttentionForwardBF16(const void*, void*, float*, int64_t, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int AttentionBackwardBF16(const void*, const void*, const void*, const float*, float*, void*,
                          int64_t, int64_t, int64_t, int64_t, void*) {
  return kNotBuiltWithCuda;
}
int SquaredNorm(const void*, Elem, int64_t, float*, bool, void*) { return kNotBuiltWithCuda; }
int AdamStep(float*, const void*, Elem, float*, float*, const AdamKernelScalars&, int64_t, void*) {
  return kNotBuiltWithCuda;
}

}  // namespace memwall::ops::cuda
