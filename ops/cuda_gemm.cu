// The matmuls of ops/cuda_kernels.h.
//
//   fp32 operands:   cublasSgemm, full fp32 (no TF32).
//   16-bit operands: cublasLtMatmul, fp32 compute and scale, D written over C:
//                      D = round(alpha op(A) op(B) + beta C + 1 bias^T)
//                    with the bias added by Lt's bias epilogue where it
//                    applies (the bias stored as C's type and 16-byte
//                    aligned), so y = xW + b costs one pass over y.
//
// A misaligned bias of a 16-bit C is first copied to an aligned staging
// area at the end of the stream's Lt workspace, so it takes the epilogue
// too; one too wide for that area (over 128K columns), or one under a
// shape with no unsplit algorithm, goes through the fp32 scratch below.
// Where the epilogue does not apply to an fp32 C (a 16-bit bias, fp32
// operands), the bias is first broadcast into C and the GEMM runs with
// beta = 1: the same single fp32 sum and one rounding, because a bias the
// contract accepts is exact in C's type and C is fp32.
//
// [Note: a 16-bit C with beta != 0]
// Lt's kernels that add beta C to a 16-bit C do not round once: on an H200
// at (64, 128, 256) a bf16 C came out 1.1 ulps from round(alpha AB + C),
// as if the product were rounded to bf16 before C is added (and a bias
// broadcast into C, 3.5 ulps). So a 16-bit C with beta != 0 (a weight
// gradient accumulated into a 16-bit gradient), or with a bias the
// epilogue cannot take, runs in blocks of rows: the product into an fp32
// scratch (beta = 0, one fp32 sum over K), then one pass
// C = round(scratch + beta C + bias). Two extra passes over C's block:
// small beside a GEMM whose K is the batch's tokens. Only where that
// scratch cannot be allocated does C go through Lt as above. Where Lt's
// heuristic offers no algorithm for a shape, or Lt refuses the call, the
// same GEMM runs through cublasGemmEx (remembered per shape).
//
// [Note: one rounding of C]
// A 16-bit C is rounded once, from the fp32 sum over all of K plus the
// bias. cuBLAS may split K across thread blocks (split-K) and add the parts
// in C's own type (Lt's INPLACE and OUTPUT_TYPE reduction schemes,
// cublasGemmEx's "reduced precision reduction"), which rounds a bf16 C once
// per part; both are turned off here. Split-K whose parts meet in fp32
// (Lt's COMPUTE_TYPE scheme) stays allowed, except under the bias
// epilogue: there the reduction adds the bias to a product already rounded
// to C's type (a bf16 C one ulp off at (37, 29, 300) on an H100), so a GEMM
// with the epilogue runs unsplit. Lt is asked for these schemes and each
// candidate's own config (split count, scheme) is checked before it runs;
// a shape with no unsplit candidate takes the bias through the fp32
// scratch of [Note: a 16-bit C with beta != 0].
//
// Row-major storage and column-major BLAS: a row-major (m, n) matrix is the
// column-major (n, m) matrix with the same leading dimension, so row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: one GEMM with A and
// B swapped. The bias, one value per column of row-major C, is one value per
// row of column-major D, which is what Lt's epilogue broadcasts.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "ops/cuda_kernels.h"
#include "runtime/dtype_bits.h"

namespace memwall::ops::cuda {
namespace {

// ---- cuBLAS and cuBLASLt, opened on first use --------------------------------

// [Note: cuBLAS opened on first use]
// The GEMMs reach cuBLAS and cuBLASLt through this table, filled from
// dlopen on the first call, instead of linking them: loading cuBLASLt runs
// its set-up whether or not the process ever uses a GPU (about half a
// second of CPU per process on a 2-core VM, in every test, rank and tool
// that links ops/), and a machine whose cuBLAS is missing still runs
// everything but the CUDA GEMMs, which say why they cannot. The libraries
// are looked up by soname (LD_LIBRARY_PATH, the binary's run path, the
// loader's cache), of the major version the code was compiled against.
// cublasGemmEx is overloaded in C++ (an inline form takes the compute type
// as a cudaDataType); this is the exported one.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                    const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                    const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
struct CublasApi {
  decltype(&::cublasCreate) create;
  decltype(&::cublasSetMathMode) set_math_mode;
  decltype(&::cublasSetStream) set_stream;
  decltype(&::cublasSgemm) sgemm;
  GemmExFn gemm_ex;
  decltype(&::cublasLtCreate) lt_create;
  decltype(&::cublasLtMatmul) lt_matmul;
  decltype(&::cublasLtMatmulDescCreate) lt_desc_create;
  decltype(&::cublasLtMatmulDescSetAttribute) lt_desc_set;
  decltype(&::cublasLtMatmulDescDestroy) lt_desc_destroy;
  decltype(&::cublasLtMatrixLayoutCreate) lt_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) lt_layout_destroy;
  decltype(&::cublasLtMatmulPreferenceCreate) lt_preference_create;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) lt_preference_set;
  decltype(&::cublasLtMatmulPreferenceDestroy) lt_preference_destroy;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) lt_heuristic;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) lt_algo_config_get;
};

#define MEMWALL_SYMBOL_NAME(f) MEMWALL_SYMBOL_NAME_(f)  // after macro expansion: cublasCreate_v2
#define MEMWALL_SYMBOL_NAME_(f) #f

struct CublasLibraries {
  CublasApi api{};
  std::string error;  // empty once every symbol resolved
};

const CublasLibraries& Cublas() {
  static const CublasLibraries* loaded = [] {
    auto* l = new CublasLibraries;  // never freed: the libraries stay open until exit
    const std::string major = std::to_string(CUBLAS_VER_MAJOR);
    // cuBLASLt first: cuBLAS needs it, and it is the one the GEMMs use most.
    void* lt = dlopen(("libcublasLt.so." + major).c_str(), RTLD_NOW | RTLD_GLOBAL);
    void* blas = lt != nullptr ? dlopen(("libcublas.so." + major).c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
    if (blas == nullptr) {
      const char* why = dlerror();
      l->error = std::string("cannot open cuBLAS ") + major + " (" + (why != nullptr ? why : "unknown") + ")";
      return l;
    }
    auto resolve = [&](auto& member, void* library, const char* name) {
      member = reinterpret_cast<std::remove_reference_t<decltype(member)>>(dlsym(library, name));
      if (member == nullptr && l->error.empty()) l->error = std::string("cuBLAS has no ") + name;
    };
    CublasApi& a = l->api;
    resolve(a.create, blas, MEMWALL_SYMBOL_NAME(cublasCreate));
    resolve(a.set_math_mode, blas, MEMWALL_SYMBOL_NAME(cublasSetMathMode));
    resolve(a.set_stream, blas, MEMWALL_SYMBOL_NAME(cublasSetStream));
    resolve(a.sgemm, blas, MEMWALL_SYMBOL_NAME(cublasSgemm));
    resolve(a.gemm_ex, blas, MEMWALL_SYMBOL_NAME(cublasGemmEx));
    resolve(a.lt_create, lt, MEMWALL_SYMBOL_NAME(cublasLtCreate));
    resolve(a.lt_matmul, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmul));
    resolve(a.lt_desc_create, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulDescCreate));
    resolve(a.lt_desc_set, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulDescSetAttribute));
    resolve(a.lt_desc_destroy, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulDescDestroy));
    resolve(a.lt_layout_create, lt, MEMWALL_SYMBOL_NAME(cublasLtMatrixLayoutCreate));
    resolve(a.lt_layout_destroy, lt, MEMWALL_SYMBOL_NAME(cublasLtMatrixLayoutDestroy));
    resolve(a.lt_preference_create, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulPreferenceCreate));
    resolve(a.lt_preference_set, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulPreferenceSetAttribute));
    resolve(a.lt_preference_destroy, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulPreferenceDestroy));
    resolve(a.lt_heuristic, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulAlgoGetHeuristic));
    resolve(a.lt_algo_config_get, lt, MEMWALL_SYMBOL_NAME(cublasLtMatmulAlgoConfigGetAttribute));
    return l;
  }();
  return *loaded;
}

// The table, once LoadCublas() has returned 0.
const CublasApi& Api() { return Cublas().api; }

cudaDataType_t CudaType(Elem e) {
  switch (e) {
    case Elem::kF16: return CUDA_R_16F;
    case Elem::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

int CurrentDevice() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

// cuBLAS handle per device for the process (creating one costs ~ms). It
// carries a stream, so calls through it are serialized.
std::mutex blas_mu;
cublasHandle_t BlasHandle(int device) {
  static std::map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t handle = nullptr;
  if (Api().create(&handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
  // Full fp32 (no TF32), and split-K partial sums added in fp32, never in a
  // 16-bit C's type: see [Note: one rounding of C].
  Api().set_math_mode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  handles[device] = handle;
  return handle;
}

int Blas(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS ? 0 : kCublasError; }

// ---- Broadcast of the bias into C -----------------------------------------

template <typename T>
__device__ float Widen(T x, Elem e) {
  if constexpr (sizeof(T) == 4) {
    return x;
  } else {
    return e == Elem::kF16 ? HalfToFloat(x) : BF16ToFloat(x);
  }
}

// c[i, j] = bias[j] in C's type: exact, since the bias is C's type or C is
// fp32 (a 16-bit bias widens exactly).
template <typename C, typename B>
__global__ void BroadcastRowsKernel(C* c, int64_t ldc, const B* bias, Elem bias_type, int64_t m,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / n, col = i % n;
    if constexpr (sizeof(C) == sizeof(B)) {
      c[row * ldc + col] = bias[col];
    } else {
      c[row * ldc + col] = Widen(bias[col], bias_type);
    }
  }
}

int BroadcastBias(void* c, int64_t ldc, Elem c_type, const void* bias, Elem bias_type, int64_t m,
                  int64_t n, cudaStream_t s) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((m * n + kThreads - 1) / kThreads, 65535 * 16);
  if (c_type != Elem::kF32) {  // bias_type == c_type: a 16-bit copy
    BroadcastRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        static_cast<uint16_t*>(c), ldc, static_cast<const uint16_t*>(bias), bias_type, m, n);
  } else if (bias_type == Elem::kF32) {
    BroadcastRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        static_cast<float*>(c), ldc, static_cast<const float*>(bias), bias_type, m, n);
  } else {
    BroadcastRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        static_cast<float*>(c), ldc, static_cast<const uint16_t*>(bias), bias_type, m, n);
  }
  return static_cast<int>(cudaGetLastError());
}

// ---- cuBLASLt ---------------------------------------------------------------

// Owns one Lt descriptor; destroys it on scope exit.
template <typename H, auto CublasApi::*Destroy>
struct LtObject {
  H h = nullptr;
  LtObject() = default;
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  ~LtObject() {
    if (h != nullptr) (Api().*Destroy)(h);
  }
};
using MatmulDesc = LtObject<cublasLtMatmulDesc_t, &CublasApi::lt_desc_destroy>;
using Layout = LtObject<cublasLtMatrixLayout_t, &CublasApi::lt_layout_destroy>;
using Preference = LtObject<cublasLtMatmulPreference_t, &CublasApi::lt_preference_destroy>;

// The largest power of two (up to 256) that divides the address: Lt's
// heuristic must only offer algorithms that accept the pointers we pass.
uint32_t Alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// What the heuristic's choice depends on.
struct GemmShape {
  int device;
  bool transpose_a, transpose_b;
  int64_t m, n, k, lda, ldb, ldc;
  Elem ab, c_type;
  bool epilogue_bias, beta_zero;
  uint32_t align_a, align_b, align_c;
  auto Key() const {
    return std::make_tuple(device, transpose_a, transpose_b, m, n, k, lda, ldb, ldc,
                           static_cast<int>(ab), static_cast<int>(c_type), epilogue_bias,
                           beta_zero, align_a, align_b, align_c);
  }
  bool operator<(const GemmShape& o) const { return Key() < o.Key(); }
};

// The fp32 scratch of a 16-bit C with beta != 0, per (device, stream) that
// runs one (see [Note: a 16-bit C with beta != 0]), held for the process.
constexpr uint64_t kWideBlockBytes = uint64_t{64} << 20;

// The end of each workspace stages a misaligned 16-bit bias (up to
// kBiasStagingBytes / 2 columns); Lt gets the rest.
constexpr uint64_t kBiasStagingBytes = uint64_t{256} << 10;
constexpr uint64_t kLtWorkspaceBytes = kGemmWorkspaceBytes - kBiasStagingBytes;

// Per device: the Lt handle (stateless across streams, so it is shared).
// Per (device, stream): a workspace of kGemmWorkspaceBytes, held for the
// process, so two streams never share one. Per shape: the heuristic's
// algorithm, or none (then cublasGemmEx runs).
struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;
  std::map<std::pair<int, cudaStream_t>, float*> wide_blocks;  // kWideBlockBytes each
  std::map<GemmShape, std::pair<bool, cublasLtMatmulAlgo_t>> algos;
};
LtState& Lt() {
  static LtState* state = new LtState;  // never destroyed: used until exit
  return *state;
}

// The descriptors of one call. Lt is column-major: its A is our B and its B
// is our A (see the top of this file).
struct LtCall {
  MatmulDesc desc;
  Layout a, b, c;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;

  void Check(cublasStatus_t s) {
    if (status == CUBLAS_STATUS_SUCCESS) status = s;
  }
  LtCall(const GemmShape& g, const void* bias) {
    Check(Api().lt_desc_create(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (status != CUBLAS_STATUS_SUCCESS) return;
    const int32_t op_a = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_b = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    Check(Api().lt_desc_set(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    Check(Api().lt_desc_set(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (g.epilogue_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      Check(Api().lt_desc_set(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)));
      Check(Api().lt_desc_set(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)));
    }
    // Column-major shapes: Lt's A = op(B)^T's storage, B = op(A)^T's, D (n, m).
    Check(Api().lt_layout_create(&a.h, CudaType(g.ab), g.transpose_b ? g.k : g.n,
                                     g.transpose_b ? g.n : g.k, g.ldb));
    Check(Api().lt_layout_create(&b.h, CudaType(g.ab), g.transpose_a ? g.m : g.k,
                                     g.transpose_a ? g.k : g.m, g.lda));
    Check(Api().lt_layout_create(&c.h, CudaType(g.c_type), g.n, g.m, g.ldc));
  }
};

// Whether `algo`, as configured, rounds C once (see [Note: one rounding of
// C]): its split-K parts meet in a scheme of `reductions`, and under the bias
// epilogue K is not split at all. A config that cannot be read is refused.
bool KeepsOneRounding(const cublasLtMatmulAlgo_t& algo, bool epilogue_bias, uint32_t reductions) {
  int32_t splits = 1;
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (Api().lt_algo_config_get(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits),
                                           &written) != CUBLAS_STATUS_SUCCESS ||
      Api().lt_algo_config_get(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  if (splits <= 1) return true;
  return !epilogue_bias && scheme != CUBLASLT_REDUCTION_SCHEME_NONE && (scheme & ~reductions) == 0;
}

// The cached algorithm for `g`, asking the heuristic on first use. false:
// none that rounds C once (or Lt failed), so the caller goes another way.
bool FindAlgo(LtState& lt, cublasLtHandle_t handle, const GemmShape& g, const LtCall& call,
              cublasLtMatmulAlgo_t* algo) {
  if (auto it = lt.algos.find(g); it != lt.algos.end()) {
    *algo = it->second.second;
    return it->second.first;
  }
  Preference pref;
  bool found = Api().lt_preference_create(&pref.h) == CUBLAS_STATUS_SUCCESS;
  const uint64_t workspace = kLtWorkspaceBytes;
  // No split-K whose partial sums meet in C's type, none at all under the
  // bias epilogue: see [Note: one rounding of C].
  const uint32_t reductions =
      g.epilogue_bias ? CUBLASLT_REDUCTION_SCHEME_NONE
                      : CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.align_c},
  };
  if (found) {
    found = Api().lt_preference_set(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof(workspace)) == CUBLAS_STATUS_SUCCESS &&
            Api().lt_preference_set(pref.h, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &reductions, sizeof(reductions)) == CUBLAS_STATUS_SUCCESS;
    for (const auto& [attribute, bytes] : alignments) {
      found = found && Api().lt_preference_set(pref.h, attribute, &bytes, sizeof(bytes)) ==
                           CUBLAS_STATUS_SUCCESS;
    }
  }
  // The heuristic's candidates, best first; the first one whose own config
  // keeps to the rule above is taken (the mask is a request, the config is
  // what runs).
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int count = 0;
  found = found && call.status == CUBLAS_STATUS_SUCCESS &&
          Api().lt_heuristic(handle, call.desc.h, call.a.h, call.b.h, call.c.h, call.c.h,
                                         pref.h, kCandidates, results, &count) == CUBLAS_STATUS_SUCCESS;
  const cublasLtMatmulHeuristicResult_t* chosen = nullptr;
  for (int i = 0; found && i < count && chosen == nullptr; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && KeepsOneRounding(results[i].algo, g.epilogue_bias, reductions)) {
      chosen = &results[i];
    }
  }
  found = chosen != nullptr;
  const cublasLtMatmulAlgo_t none{};
  lt.algos[g] = {found, found ? chosen->algo : none};
  *algo = lt.algos[g].second;
  return found;
}

// The stream's workspace (kGemmWorkspaceBytes), allocated on first use;
// null if that fails. The caller holds lt.mu.
void* Workspace(LtState& lt, int device, cudaStream_t stream) {
  void*& workspace = lt.workspaces[{device, stream}];
  if (workspace == nullptr && cudaMalloc(&workspace, kGemmWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();  // clear it
    workspace = nullptr;
  }
  return workspace;
}

// A copy of `bytes` of bias at the stream's staging area (16-byte aligned),
// in the stream's order: the GEMM before reads its own copy, the one after
// overwrites it only once this one ran. Null where it does not fit.
const void* StageBias(const void* bias, uint64_t bytes, int device, cudaStream_t stream) {
  if (bytes > kBiasStagingBytes) return nullptr;
  LtState& lt = Lt();
  std::lock_guard<std::mutex> lock(lt.mu);
  char* const workspace = static_cast<char*>(Workspace(lt, device, stream));
  if (workspace == nullptr) return nullptr;
  char* const staged = workspace + kLtWorkspaceBytes;
  if (cudaMemcpyAsync(staged, bias, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return staged;
}

// The stream's fp32 scratch (kWideBlockBytes), allocated on first use;
// null if that fails.
float* WideBlock(int device, cudaStream_t stream) {
  LtState& lt = Lt();
  std::lock_guard<std::mutex> lock(lt.mu);
  float*& block = lt.wide_blocks[{device, stream}];
  if (block == nullptr && cudaMalloc(reinterpret_cast<void**>(&block), kWideBlockBytes) != cudaSuccess) {
    cudaGetLastError();  // clear it
    block = nullptr;
  }
  return block;
}

// c[i, j] = round(wide[i, j] + beta c[i, j] + bias[j]) for an (m, n) block,
// c and the bias (null: none) 16-bit; c is not read where beta is 0.
__global__ void AddWideKernel(uint16_t* c, int64_t ldc, Elem c_type, const float* wide, float beta,
                              const uint16_t* bias, int64_t m, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint16_t& out = c[(i / n) * ldc + i % n];
    float sum = wide[i];
    if (beta != 0.0f) sum += beta * Widen(out, c_type);
    if (bias != nullptr) sum += Widen(bias[i % n], c_type);
    out = c_type == Elem::kF16 ? FloatToHalf(sum) : FloatToBF16(sum);
  }
}

// A 16-bit C through the stream's fp32 scratch ([Note: a 16-bit C with
// beta != 0]): per block of rows, the product (beta = 0) into the scratch,
// then AddWideKernel. kNoScratch, with nothing enqueued, where the scratch
// cannot be had or one row of C does not fit it.
constexpr int kNoScratch = -1;
int GemmThroughScratch(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const void* a, int64_t lda, const void* b, int64_t ldb, Elem ab, float beta, void* c,
                       int64_t ldc, Elem c_type, const void* bias, int device, cudaStream_t s) {
  if (static_cast<uint64_t>(n) * sizeof(float) > kWideBlockBytes) return kNoScratch;
  float* const wide = WideBlock(device, s);
  if (wide == nullptr) return kNoScratch;
  // Blocks of a multiple of 8 rows keep op(A)'s rows 16-byte aligned.
  int64_t rows = static_cast<int64_t>(kWideBlockBytes / (n * sizeof(float)));
  if (rows >= 8) rows = rows / 8 * 8;
  constexpr size_t kBytes16 = 2;  // A's, C's and the bias's elements
  for (int64_t m0 = 0; m0 < m; m0 += rows) {
    const int64_t mb = std::min(rows, m - m0);
    // op(A)'s rows [m0, m0 + mb): stored columns when transposed, rows otherwise.
    const void* a_rows = static_cast<const char*>(a) + (transpose_a ? m0 : m0 * lda) * kBytes16;
    if (const int error = Gemm(transpose_a, transpose_b, mb, n, k, alpha, a_rows, lda, b, ldb, ab, 0.0f, wide, n,
                               Elem::kF32, nullptr, Elem::kF32, s);
        error != 0) {
      return error;
    }
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((mb * n + kThreads - 1) / kThreads, 65535 * 16);
    AddWideKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        reinterpret_cast<uint16_t*>(static_cast<char*>(c) + m0 * ldc * kBytes16), ldc, c_type, wide, beta,
        static_cast<const uint16_t*>(bias), mb, n);
    if (const int error = static_cast<int>(cudaGetLastError()); error != 0) return error;
  }
  return 0;
}

// D = alpha op(A) op(B) + beta C (+ bias with the epilogue) through Lt.
// Returns false where Lt has no algorithm or refuses the call (nothing was
// enqueued then), so the caller runs cublasGemmEx instead.
bool LtGemm(const GemmShape& g, float alpha, const void* a, const void* b, float beta, void* c,
            const void* bias, cudaStream_t stream) {
  LtState& lt = Lt();
  std::lock_guard<std::mutex> lock(lt.mu);
  cublasLtHandle_t& handle = lt.handles[g.device];
  if (handle == nullptr && Api().lt_create(&handle) != CUBLAS_STATUS_SUCCESS) {
    handle = nullptr;
    return false;
  }
  void* const workspace = Workspace(lt, g.device, stream);
  if (workspace == nullptr) return false;  // the fallback runs without one
  LtCall call(g, bias);
  cublasLtMatmulAlgo_t algo;
  if (!FindAlgo(lt, handle, g, call, &algo)) return false;
  const cublasStatus_t status =
      Api().lt_matmul(handle, call.desc.h, &alpha, b, call.a.h, a, call.b.h, &beta, c, call.c.h, c,
                     call.c.h, &algo, workspace, kLtWorkspaceBytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    lt.algos[g].first = false;  // refused: this shape goes to cublasGemmEx from now on
    return false;
  }
  return true;
}

}  // namespace

int LoadCublas() { return Cublas().error.empty() ? 0 : kCublasNotLoaded; }
const char* CublasLoadError() { return Cublas().error.c_str(); }

int Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
         const void* a, int64_t lda, const void* b, int64_t ldb, Elem ab, float beta, void* c,
         int64_t ldc, Elem c_type, const void* bias, Elem bias_type, void* stream) {
  if (m == 0 || n == 0) return 0;
  if (const int error = LoadCublas(); error != 0) return error;
  // [Note: a GEMM in aligned parts]
  // cuBLAS's fast 16-bit kernels read and write 16-byte vectors along m and
  // n, so an m or n that is not a multiple of 8 (the classifier's 50257
  // columns of logits, its weight gradient's 50257 rows) sends the whole
  // GEMM to slower kernels. Such a GEMM runs as the aligned part and the
  // last m % 8 rows or n % 8 columns: disjoint blocks of C, each element
  // still one fp32 sum over all of K, rounded once. A K that is not a
  // multiple of 8 (the classifier's input gradient sums over the 50257
  // words) splits only into an fp32 C: the first k - k % 8 terms, then the
  // rest added with beta = 1, two fp32 sums meeting in fp32; a 16-bit C
  // would be rounded between them.
  if (ab != Elem::kF32 && k > 0) {
    constexpr int64_t kVector = 8;
    const auto at = [](const void* p, int64_t elements, Elem e) {
      return static_cast<const char*>(p) + elements * (e == Elem::kF32 ? 4 : 2);
    };
    if (const int64_t n0 = n / kVector * kVector; n0 != n && n0 > 0) {
      // op(B)'s columns [n0, n): stored rows when transposed, columns otherwise.
      const void* b_tail = at(b, transpose_b ? n0 * ldb : n0, ab);
      void* c_tail = const_cast<char*>(at(c, n0, c_type));
      const void* bias_tail = bias != nullptr ? at(bias, n0, bias_type) : nullptr;
      if (const int error = Gemm(transpose_a, transpose_b, m, n0, k, alpha, a, lda, b, ldb, ab, beta, c, ldc,
                                 c_type, bias, bias_type, stream);
          error != 0) {
        return error;
      }
      return Gemm(transpose_a, transpose_b, m, n - n0, k, alpha, a, lda, b_tail, ldb, ab, beta, c_tail, ldc,
                  c_type, bias_tail, bias_type, stream);
    }
    if (const int64_t m0 = m / kVector * kVector; m0 != m && m0 > 0) {
      // op(A)'s rows [m0, m): stored columns when transposed, rows otherwise.
      const void* a_tail = at(a, transpose_a ? m0 : m0 * lda, ab);
      void* c_tail = const_cast<char*>(at(c, m0 * ldc, c_type));
      if (const int error = Gemm(transpose_a, transpose_b, m0, n, k, alpha, a, lda, b, ldb, ab, beta, c, ldc,
                                 c_type, bias, bias_type, stream);
          error != 0) {
        return error;
      }
      return Gemm(transpose_a, transpose_b, m - m0, n, k, alpha, a_tail, lda, b, ldb, ab, beta, c_tail, ldc,
                  c_type, bias, bias_type, stream);
    }
    if (const int64_t k0 = k / kVector * kVector; c_type == Elem::kF32 && k0 != k && k0 > 0) {
      // op(A)'s columns [k0, k): stored rows when transposed, columns otherwise;
      // op(B)'s rows [k0, k): stored columns when transposed, rows otherwise.
      const void* a_tail = at(a, transpose_a ? k0 * lda : k0, ab);
      const void* b_tail = at(b, transpose_b ? k0 : k0 * ldb, ab);
      if (const int error = Gemm(transpose_a, transpose_b, m, n, k0, alpha, a, lda, b, ldb, ab, beta, c, ldc,
                                 c_type, bias, bias_type, stream);
          error != 0) {
        return error;
      }
      return Gemm(transpose_a, transpose_b, m, n, k - k0, alpha, a_tail, lda, b_tail, ldb, ab, 1.0f, c, ldc,
                  c_type, nullptr, bias_type, stream);
    }
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const int device = CurrentDevice();
  const bool sixteen_bit_c = ab != Elem::kF32 && c_type != Elem::kF32 && k > 0;
  const bool c_typed_bias = bias != nullptr && bias_type == c_type;  // a 16-bit C's (cuda_kernels.h)
  if (sixteen_bit_c && c_typed_bias && Alignment(bias) < 16) {
    if (const void* staged = StageBias(bias, static_cast<uint64_t>(n) * 2, device, s)) bias = staged;
  }
  const bool epilogue_bias = sixteen_bit_c && c_typed_bias && Alignment(bias) >= 16;
  // Lt would round a 16-bit C twice: with beta C, or a bias it adds
  // through C (one too wide to stage).
  if (sixteen_bit_c && (bias == nullptr ? beta != 0.0f : c_typed_bias && !epilogue_bias)) {
    if (const int error = GemmThroughScratch(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, ab, beta, c,
                                             ldc, c_type, bias, device, s);
        error != kNoScratch) {
      return error;
    }
  }
  if (bias != nullptr && !epilogue_bias) {
    // C = bias, then C = alpha op(A) op(B) + 1 * C (beta is 0 with a bias).
    if (const int error = BroadcastBias(c, ldc, c_type, bias, bias_type, m, n, s); error != 0) {
      return error;
    }
    beta = 1.0f;
  }
  if (ab != Elem::kF32) {
    GemmShape g{device, transpose_a, transpose_b, m, n, k, lda, ldb, ldc, ab, c_type,
                epilogue_bias, beta == 0.0f, Alignment(a), Alignment(b), Alignment(c)};
    if (k > 0 && LtGemm(g, alpha, a, b, beta, c, bias, s)) return static_cast<int>(cudaGetLastError());
    if (epilogue_bias) {  // no unsplit algorithm, or Lt said no: through the scratch, else as above
      if (const int error = GemmThroughScratch(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, ab, 0.0f,
                                               c, ldc, c_type, bias, device, s);
          error != kNoScratch) {
        return error;
      }
      if (const int error = BroadcastBias(c, ldc, c_type, bias, bias_type, m, n, s); error != 0) {
        return error;
      }
      beta = 1.0f;
      g.epilogue_bias = false;
      g.beta_zero = false;
      if (LtGemm(g, alpha, a, b, beta, c, nullptr, s)) return static_cast<int>(cudaGetLastError());
    }
  }
  std::lock_guard<std::mutex> lock(blas_mu);
  cublasHandle_t handle = BlasHandle(device);
  if (handle == nullptr || Api().set_stream(handle, s) != CUBLAS_STATUS_SUCCESS) return kCublasError;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (ab == Elem::kF32) {
    return Blas(Api().sgemm(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, static_cast<const float*>(b),
                            static_cast<int>(ldb), static_cast<const float*>(a),
                            static_cast<int>(lda), &beta, static_cast<float*>(c),
                            static_cast<int>(ldc)));
  }
  return Blas(Api().gemm_ex(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                           static_cast<int>(k), &alpha, b, CudaType(ab), static_cast<int>(ldb), a,
                           CudaType(ab), static_cast<int>(lda), &beta, c, CudaType(c_type),
                           static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace memwall::ops::cuda
