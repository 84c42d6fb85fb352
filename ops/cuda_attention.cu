// Causal self-attention on tensor cores for bf16 activations: the
// flash-attention scheme (Dao et al. 2022; FlashAttention-2's split of the
// work), written for memwall with WMMA (sm_80 and later).
//
// Forward, one block per (64 queries, batch x head), four warps of 16
// query rows: for each 64-key tile up to the diagonal,
//   S = Q K^T                                   (tensor cores, fp32 accumulate)
//   m' = max(m, rowmax(S)),  P = exp(S - m')    (fp32, rounded to bf16 for P V)
//   l = l exp(m - m') + rowsum(P),  O = O exp(m - m') + P V
// and finally out = O / l, lse = m + log l (saved for the backward). Scores
// are kept in log2 units (scale * log2 e folded into S) so exp is exp2.
//
// Backward, deterministic (no atomics): with delta_i = dout_i . out_i,
//   P = exp(S - lse),  dP = dO V^T,  dS = P (dP - delta)
//   dV = P^T dO,  dK = scale dS^T Q,  dQ = scale dS K
// in two kernels that each recompute P: one per key tile (dK, dV: summed
// over query tiles in order) and one per query tile (dQ: summed over key
// tiles in order). The (t, t) matrices exist only as one 64 x 64 tile per
// block in shared memory.
//
// WMMA fragments are opaque, so the per-row work (softmax statistics, the
// rescale of O) goes through per-warp fp32 staging tiles in shared memory:
// two lanes per row, 32 columns each.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "ops/cuda_kernels.h"
#include "runtime/cuda_convert.h"
#include "runtime/dtype_bits.h"

namespace memwall::ops::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;             // rows of a block's own tile, and of each streamed tile
constexpr int kWarps = kTile / 16;    // one 16-row WMMA strip per warp
constexpr int kBlockThreads = kWarps * 32;
constexpr int kPadB = 8;              // bf16 row padding: 16 bytes (fragments stay 32-byte aligned)
constexpr int kPadF = 4;              // fp32 row padding: 16 bytes
constexpr int kLdS = kTile + kPadF;   // a warp's fp32 staging tile (16 x kTile)
constexpr int kLdP = kTile + kPadB;   // a warp's bf16 staging tile (16 x kTile)
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ inline bf16 ToBF16(float x) { return __ushort_as_bfloat16(FloatToBF16(x)); }
__device__ inline float FromBF16(bf16 x) { return BF16ToFloat(__bfloat16_as_ushort(x)); }

// Where each part of a batch's (t, 3c) qkv and (t, c) out lives.
struct Shape {
  int64_t t, c;
  int heads;
  __device__ int64_t Qkv(int64_t b, int64_t i, int part, int h, int hd) const {
    return (b * t + i) * 3 * c + part * c + int64_t{h} * hd;
  }
  __device__ int64_t Out(int64_t b, int64_t i, int h, int hd) const {
    return (b * t + i) * c + int64_t{h} * hd;
  }
};

// Byte offsets of a kernel's shared-memory regions (each 128-byte aligned).
struct Smem {
  int bytes = 0;
  __host__ __device__ int Take(int n) {
    const int at = bytes;
    bytes += (n + 127) / 128 * 128;
    return at;
  }
};

// rows [row0, row0 + kTile) of a (t, HD) strided bf16 matrix into shared
// memory (ld HD + kPadB), 16 bytes per load; rows at or past t are zeros.
template <int HD>
__device__ void LoadTile(const bf16* src, int64_t stride, int64_t row0, int64_t t, bf16* dst) {
  constexpr int kVecs = HD / 8;
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += blockDim.x) {
    const int r = idx / kVecs, v = idx % kVecs;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + r < t) x = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride + v * 8);
    *reinterpret_cast<uint4*>(dst + r * (HD + kPadB) + v * 8) = x;
  }
}

// acc[16 x 16 n] = A (16 x HD, row-major at a) times B^T where B is
// (16 n x HD) row-major at b: S = Q K^T for one warp's strip.
template <int HD, int N>
__device__ void StripTimesTransposed(const bf16* a, const bf16* b, FragC (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + k * 16, HD + kPadB);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FragBCol fb;
      wmma::load_matrix_sync(fb, b + n * 16 * (HD + kPadB) + k * 16, HD + kPadB);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// acc[n] += P (16 x kTile, bf16 at p, ld kLdP) times B (kTile x HD, row-major
// at b), for the HD / 16 column blocks n.
template <int HD>
__device__ void StripTimesTile(const bf16* p, const bf16* b, FragC (&acc)[HD / 16]) {
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kLdP);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + k * 16 * (HD + kPadB) + n * 16, HD + kPadB);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

template <int N>
__device__ void StoreStrip(float* staging, const FragC (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::store_matrix_sync(staging + n * 16, acc[n], kLdS, wmma::mem_row_major);
}

// Writes a warp's 16 x HD accumulators, times `scale`, as bf16 rows
// dst(r) (nullptr for rows past t), through the fp32 staging tile.
template <int HD, typename RowFn>
__device__ void WriteStrip(const FragC (&acc)[HD / 16], float scale, float* staging, RowFn dst) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  bf16* row = dst(r);
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::store_matrix_sync(staging, acc[n], kLdS, wmma::mem_row_major);
    __syncwarp();
    if (row != nullptr) {
      alignas(16) bf16 v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = ToBF16(staging[r * kLdS + half * 8 + e] * scale);
      *reinterpret_cast<uint4*>(row + n * 16 + half * 8) = *reinterpret_cast<const uint4*>(v);
    }
    __syncwarp();
  }
}

// ---- Forward ------------------------------------------------------------------

template <int HD>
struct ForwardSmem {
  int q, k, v, s, p, o, bytes;
  __host__ __device__ ForwardSmem() {
    Smem m;
    q = m.Take(kTile * (HD + kPadB) * 2);
    k = m.Take(kTile * (HD + kPadB) * 2);
    v = m.Take(kTile * (HD + kPadB) * 2);
    s = m.Take(kWarps * 16 * kLdS * 4);
    p = m.Take(kWarps * 16 * kLdP * 2);
    o = m.Take(kWarps * 16 * (HD + kPadF) * 4);
    bytes = m.bytes;
  }
};

template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionForwardKernel(const bf16* qkv, bf16* out, float* lse, Shape sh, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ForwardSmem<HD> L;
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* s_w = reinterpret_cast<float*>(smem + L.s) + warp * 16 * kLdS;
  bf16* p_w = reinterpret_cast<bf16*>(smem + L.p) + warp * 16 * kLdP;
  float* o_w = reinterpret_cast<float*>(smem + L.o) + warp * 16 * (HD + kPadF);

  // The longest rows (last query tiles) start first.
  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t q0 = qt * kTile;
  const int64_t i = q0 + warp * 16 + r;  // this lane's query row
  const int64_t stride = 3 * sh.c;

  LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
  for (int e = lane; e < 16 * (HD + kPadF); e += 32) o_w[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // the previous K, V tiles are no longer read
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, k0, sh.t, k_s);
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, k0, sh.t, v_s);
    __syncthreads();

    FragC s[kTile / 16];
    StripTimesTransposed<HD>(q_s + warp * 16 * (HD + kPadB), k_s, s);
    StoreStrip(s_w, s);
    __syncwarp();

    // Row r's statistics; lanes 2r and 2r+1 hold 32 columns each.
    float* srow = s_w + r * kLdS + half * 32;
    float tile_max = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t j = k0 + half * 32 + c;
      const float x = j <= i && j < sh.t ? srow[c] * scale_log2 : -INFINITY;
      srow[c] = x;
      tile_max = fmaxf(tile_max, x);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
    float sum = 0.0f;
    for (int c = 0; c < 32; ++c) {
      const bf16 p = ToBF16(exp2f(srow[c] - m_use));
      p_w[r * kLdP + half * 32 + c] = p;
      sum += FromBF16(p);  // l sums what P V multiplies
    }
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    const float correction = exp2f(m - m_use);  // 0 on the first tile
    l = l * correction + sum;
    m = m_new;
    float* orow = o_w + r * (HD + kPadF) + half * (HD / 2);
    for (int d = 0; d < HD / 2; ++d) orow[d] *= correction;
    __syncwarp();

    FragC o[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) wmma::load_matrix_sync(o[n], o_w + n * 16, HD + kPadF, wmma::mem_row_major);
    StripTimesTile<HD>(p_w, v_s, o);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) wmma::store_matrix_sync(o_w + n * 16, o[n], HD + kPadF, wmma::mem_row_major);
    __syncwarp();
  }

  if (i >= sh.t) return;
  const float inv_l = 1.0f / l;
  const float* orow = o_w + r * (HD + kPadF) + half * (HD / 2);
  bf16* dst = out + sh.Out(b, i, h, HD) + half * (HD / 2);
  for (int d = 0; d < HD / 2; d += 8) {
    alignas(16) bf16 v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = ToBF16(orow[d + e] * inv_l);
    *reinterpret_cast<uint4*>(dst + d) = *reinterpret_cast<const uint4*>(v);
  }
  if (half == 0) lse[blockIdx.y * sh.t + i] = m * kLn2 + logf(l);
}

// ---- Backward -----------------------------------------------------------------

// delta_i = dout_i . out_i, one warp per row (fp32 sum of bf16 products).
__global__ void TcAttentionDeltaKernel(const bf16* out, const bf16* dout, float* delta, Shape sh,
                                       int hd) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t bh = blockIdx.y;  // b * heads + h
  const int lane = threadIdx.x % 32;
  if (i >= sh.t) return;
  const int64_t b = bh / sh.heads;
  const int h = static_cast<int>(bh % sh.heads);
  const bf16* o = out + sh.Out(b, i, h, hd);
  const bf16* g = dout + sh.Out(b, i, h, hd);
  float sum = 0.0f;
  for (int d = lane; d < hd; d += 32) sum += FromBF16(o[d]) * FromBF16(g[d]);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) delta[bh * sh.t + i] = sum;
}

template <int HD>
struct BackwardSmem {
  int own_a, own_b, other_a, other_b, s, dp, p, ds, lse, delta, bytes;
  __host__ __device__ BackwardSmem() {
    Smem m;
    own_a = m.Take(kTile * (HD + kPadB) * 2);
    own_b = m.Take(kTile * (HD + kPadB) * 2);
    other_a = m.Take(kTile * (HD + kPadB) * 2);
    other_b = m.Take(kTile * (HD + kPadB) * 2);
    s = m.Take(kWarps * 16 * kLdS * 4);
    dp = m.Take(kWarps * 16 * kLdS * 4);
    p = m.Take(kWarps * 16 * kLdP * 2);
    ds = m.Take(kWarps * 16 * kLdP * 2);
    lse = m.Take(kTile * 4);
    delta = m.Take(kTile * 4);
    bytes = m.bytes;
  }
};

// dK and dV for one 64-key tile: own_a = K, own_b = V; query tiles stream
// through other_a = Q, other_b = dO. A warp's strip is 16 keys x 64 queries:
// S^T = K Q^T, dP^T = V dO^T.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionBackwardKeyValueKernel(const bf16* qkv, const bf16* dout, const float* lse,
                                      const float* delta, bf16* dqkv, Shape sh, float scale,
                                      float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HD> L;
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.own_a);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.own_b);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.other_a);
  bf16* do_s = reinterpret_cast<bf16*>(smem + L.other_b);
  float* lse_s = reinterpret_cast<float*>(smem + L.lse);
  float* delta_s = reinterpret_cast<float*>(smem + L.delta);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* s_w = reinterpret_cast<float*>(smem + L.s) + warp * 16 * kLdS;
  float* dp_w = reinterpret_cast<float*>(smem + L.dp) + warp * 16 * kLdS;
  bf16* p_w = reinterpret_cast<bf16*>(smem + L.p) + warp * 16 * kLdP;
  bf16* ds_w = reinterpret_cast<bf16*>(smem + L.ds) + warp * 16 * kLdP;

  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t kt = blockIdx.x;  // the first key tiles see the most queries
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t k0 = kt * kTile;
  const int64_t j = k0 + warp * 16 + r;  // this lane's key row
  const int64_t stride = 3 * sh.c;
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, k0, sh.t, k_s);
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, k0, sh.t, v_s);

  FragC dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int64_t qt = kt; qt < tiles; ++qt) {
    const int64_t q0 = qt * kTile;
    __syncthreads();
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
    LoadTile<HD>(dout + sh.Out(b, 0, h, HD), sh.c, q0, sh.t, do_s);
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const bool in = q0 + e < sh.t;
      lse_s[e] = in ? lse[blockIdx.y * sh.t + q0 + e] * kLog2E : 0.0f;
      delta_s[e] = in ? delta[blockIdx.y * sh.t + q0 + e] : 0.0f;
    }
    __syncthreads();

    FragC acc[kTile / 16];
    StripTimesTransposed<HD>(k_s + warp * 16 * (HD + kPadB), q_s, acc);
    StoreStrip(s_w, acc);
    StripTimesTransposed<HD>(v_s + warp * 16 * (HD + kPadB), do_s, acc);
    StoreStrip(dp_w, acc);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t i = q0 + c;
      const bool live = j <= i && i < sh.t && j < sh.t;
      const float p = live ? exp2f(s_w[r * kLdS + c] * scale_log2 - lse_s[c]) : 0.0f;
      p_w[r * kLdP + c] = ToBF16(p);
      ds_w[r * kLdP + c] = ToBF16(p * (dp_w[r * kLdS + c] - delta_s[c]));
    }
    __syncwarp();
    StripTimesTile<HD>(p_w, do_s, dv);
    StripTimesTile<HD>(ds_w, q_s, dk);
  }
  auto row_of = [&](int part) {
    return [&, part](int rr) -> bf16* {
      const int64_t jj = k0 + warp * 16 + rr;
      return jj < sh.t ? dqkv + sh.Qkv(b, jj, part, h, HD) : nullptr;
    };
  };
  WriteStrip<HD>(dk, scale, s_w, row_of(1));
  WriteStrip<HD>(dv, 1.0f, s_w, row_of(2));
}

// dQ for one 64-query tile: own_a = Q, own_b = dO; key tiles up to the
// diagonal stream through other_a = K, other_b = V. S = Q K^T, dP = dO V^T.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionBackwardQueryKernel(const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, bf16* dqkv, Shape sh, float scale,
                                   float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HD> L;
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.own_a);
  bf16* do_s = reinterpret_cast<bf16*>(smem + L.own_b);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.other_a);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.other_b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* s_w = reinterpret_cast<float*>(smem + L.s) + warp * 16 * kLdS;
  float* dp_w = reinterpret_cast<float*>(smem + L.dp) + warp * 16 * kLdS;
  bf16* ds_w = reinterpret_cast<bf16*>(smem + L.ds) + warp * 16 * kLdP;

  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t q0 = qt * kTile;
  const int64_t i = q0 + warp * 16 + r;  // this lane's query row
  const int64_t stride = 3 * sh.c;
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
  LoadTile<HD>(dout + sh.Out(b, 0, h, HD), sh.c, q0, sh.t, do_s);
  const bool row_in = i < sh.t;
  const float lse_i = row_in ? lse[blockIdx.y * sh.t + i] * kLog2E : 0.0f;
  const float delta_i = row_in ? delta[blockIdx.y * sh.t + i] : 0.0f;

  FragC dq[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, k0, sh.t, k_s);
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, k0, sh.t, v_s);
    __syncthreads();

    FragC acc[kTile / 16];
    StripTimesTransposed<HD>(q_s + warp * 16 * (HD + kPadB), k_s, acc);
    StoreStrip(s_w, acc);
    StripTimesTransposed<HD>(do_s + warp * 16 * (HD + kPadB), v_s, acc);
    StoreStrip(dp_w, acc);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t jj = k0 + c;
      const bool live = jj <= i && row_in && jj < sh.t;
      const float p = live ? exp2f(s_w[r * kLdS + c] * scale_log2 - lse_i) : 0.0f;
      ds_w[r * kLdP + c] = ToBF16(p * (dp_w[r * kLdS + c] - delta_i));
    }
    __syncwarp();
    StripTimesTile<HD>(ds_w, k_s, dq);
  }
  WriteStrip<HD>(dq, scale, s_w, [&](int rr) -> bf16* {
    const int64_t ii = q0 + warp * 16 + rr;
    return ii < sh.t ? dqkv + sh.Qkv(b, ii, 0, h, HD) : nullptr;
  });
}

// ---- Launchers --------------------------------------------------------------

template <typename Kernel>
int Launch(Kernel kernel, dim3 grid, int smem_bytes, cudaStream_t s, auto... args) {
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem_bytes);
      err != cudaSuccess) {
    return static_cast<int>(err);
  }
  kernel<<<grid, kBlockThreads, smem_bytes, s>>>(args...);
  return static_cast<int>(cudaGetLastError());
}

// Every bf16 row is read 16 bytes at a time.
bool Aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// The fp32 kernels on widened copies: head dims the tensor-core kernels do
// not take, or unaligned buffers. Same results up to the fp32 kernels'
// rounding; slower.
struct Widened {
  float* base = nullptr;
  cudaStream_t s;
  int error = 0;
  Widened(int64_t floats, cudaStream_t stream) : s(stream) {
    error = static_cast<int>(cudaMallocAsync(reinterpret_cast<void**>(&base), floats * sizeof(float), s));
  }
  ~Widened() {
    if (base != nullptr) cudaFreeAsync(base, s);
  }
  int Widen(const void* src, float* dst, int64_t n) {
    return n == 0 ? 0 : memwall::cuda::BF16ToF32(static_cast<const uint16_t*>(src), dst, n, s);
  }
  int Narrow(const float* src, void* dst, int64_t n) {
    return n == 0 ? 0 : memwall::cuda::F32ToBF16(src, static_cast<uint16_t*>(dst), n, s);
  }
};

}  // namespace

bool TensorCoreAttention(int64_t hd) {
  if (hd != 64 && hd != 128) return false;
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 8;  // bf16 WMMA
}

int AttentionForwardBF16(const void* qkv, void* out, float* lse, int64_t batch, int64_t t,
                         int64_t heads, int64_t hd, void* stream) {
  if (batch * t * heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t c = heads * hd;
  if (!TensorCoreAttention(hd) || !Aligned({qkv, out})) {
    Widened w(batch * t * 4 * c, s);
    if (w.error != 0) return w.error;
    float* qkv32 = w.base;
    float* out32 = w.base + batch * t * 3 * c;
    if (int err = w.Widen(qkv, qkv32, batch * t * 3 * c); err != 0) return err;
    if (int err = AttentionForward(qkv32, out32, lse, batch, t, heads, hd, stream); err != 0) return err;
    return w.Narrow(out32, out, batch * t * c);
  }
  const Shape sh{t, c, static_cast<int>(heads)};
  const dim3 grid(static_cast<unsigned>((t + kTile - 1) / kTile), static_cast<unsigned>(batch * heads));
  const float scale_log2 = kLog2E / sqrtf(static_cast<float>(hd));
  auto q = static_cast<const bf16*>(qkv);
  auto o = static_cast<bf16*>(out);
  if (hd == 64) {
    return Launch(TcAttentionForwardKernel<64>, grid, ForwardSmem<64>().bytes, s, q, o, lse, sh, scale_log2);
  }
  return Launch(TcAttentionForwardKernel<128>, grid, ForwardSmem<128>().bytes, s, q, o, lse, sh,
                scale_log2);
}

int AttentionBackwardBF16(const void* qkv, const void* out, const void* dout, const float* lse,
                          float* delta, void* dqkv, int64_t batch, int64_t t, int64_t heads,
                          int64_t hd, void* stream) {
  if (batch * t * heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t c = heads * hd;
  if (!TensorCoreAttention(hd) || !Aligned({qkv, out, dout, dqkv})) {
    const int64_t n_qkv = batch * t * 3 * c, n_out = batch * t * c;
    Widened w(2 * n_qkv + 2 * n_out, s);
    if (w.error != 0) return w.error;
    float* qkv32 = w.base;
    float* dqkv32 = qkv32 + n_qkv;
    float* out32 = dqkv32 + n_qkv;
    float* dout32 = out32 + n_out;
    if (int err = w.Widen(qkv, qkv32, n_qkv); err != 0) return err;
    if (int err = w.Widen(out, out32, n_out); err != 0) return err;
    if (int err = w.Widen(dout, dout32, n_out); err != 0) return err;
    if (int err = AttentionBackward(qkv32, out32, dout32, lse, delta, dqkv32, batch, t, heads, hd,
                                    stream);
        err != 0) {
      return err;
    }
    return w.Narrow(dqkv32, dqkv, n_qkv);
  }
  const Shape sh{t, c, static_cast<int>(heads)};
  auto q = static_cast<const bf16*>(qkv);
  auto o = static_cast<const bf16*>(out);
  auto g = static_cast<const bf16*>(dout);
  auto dq = static_cast<bf16*>(dqkv);
  const dim3 delta_grid(static_cast<unsigned>((t * 32 + 255) / 256), static_cast<unsigned>(batch * heads));
  TcAttentionDeltaKernel<<<delta_grid, 256, 0, s>>>(o, g, delta, sh, static_cast<int>(hd));
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return static_cast<int>(err);
  const dim3 grid(static_cast<unsigned>((t + kTile - 1) / kTile), static_cast<unsigned>(batch * heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const float scale_log2 = scale * kLog2E;
  auto run = [&](auto hd_tag) {
    constexpr int kHd = decltype(hd_tag)::value;
    const int bytes = BackwardSmem<kHd>().bytes;
    if (int err = Launch(TcAttentionBackwardKeyValueKernel<kHd>, grid, bytes, s, q, g, lse,
                         static_cast<const float*>(delta), dq, sh, scale, scale_log2);
        err != 0) {
      return err;
    }
    return Launch(TcAttentionBackwardQueryKernel<kHd>, grid, bytes, s, q, g, lse,
                  static_cast<const float*>(delta), dq, sh, scale, scale_log2);
  };
  return hd == 64 ? run(std::integral_constant<int, 64>{}) : run(std::integral_constant<int, 128>{});
}

}  // namespace memwall::ops::cuda
