// Causal self-attention on tensor cores for bf16 activations: the
// flash-attention scheme (Dao et al. 2022; FlashAttention-2's split of the
// work), written for memwall with mma.sync (sm_80 and later).
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
// tiles in order). The (t, t) matrices exist only as a warp's 16 x 64
// slice, in registers.
//
// [Note: mma fragments]
// Each warp multiplies with mma.sync.m16n8k16 (bf16 in, fp32 out), whose
// operand layouts PTX fixes. With g = lane / 4 and q = lane % 4:
//   C, D (16 x 8 fp32): c0, c1 = row g, columns 2q, 2q + 1; c2, c3 = row g + 8;
//   A (16 x 16 bf16, two per register): a0 = row g, columns 2q, 2q + 1;
//     a1 = row g + 8; a2, a3 = the same rows, columns 8 + 2q, 9 + 2q;
//   B (16 x 8): b0 = rows 2q, 2q + 1 of column g; b1 = rows 8 + 2q, 9 + 2q.
// So the accumulators of two 8-column tiles of S are, rounded to bf16 in
// pairs, the A operand of one 16-deep step of P V: P never leaves
// registers. Operands in shared memory come in with ldmatrix: row-major
// 16 x 16 blocks as A; a matrix stored (n, k), as K is for S = Q K^T, as B;
// one stored (k, n), as V is for P V, as B through ldmatrix's transpose.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda_kernels.h"
#include "runtime/cuda_convert.h"
#include "runtime/dtype_bits.h"

namespace memwall::ops::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;             // rows of a block's own tile, and of each streamed tile
constexpr int kWarps = kTile / 16;    // one 16-row strip per warp
constexpr int kBlockThreads = kWarps * 32;
constexpr int kPadB = 8;              // bf16 row padding: 16 bytes, so ldmatrix's 8 rows hit 8 bank groups
constexpr int kSteps = kTile / 16;    // 16-deep mma steps across a 64-wide tile
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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

// Shared memory of a kernel: `tiles` (64, HD) bf16 tiles, then `floats`.
template <int HD>
constexpr int SmemBytes(int tiles, int floats) {
  return tiles * kTile * (HD + kPadB) * 2 + floats * 4;
}

__device__ inline uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Starts copying rows [row0, row0 + kTile) of a (t, HD) strided bf16
// matrix into shared memory (ld HD + kPadB), 16 bytes per cp.async; rows at
// or past t become zeros. The copies land by CommitLoads' group: a tile is
// read only after WaitLoads for its group and a __syncthreads.
template <int HD>
__device__ void LoadTile(const bf16* src, int64_t stride, int64_t row0, int64_t t, bf16* dst) {
  constexpr int kVecs = HD / 8;
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += blockDim.x) {
    const int r = idx / kVecs, v = idx % kVecs;
    const bool in = row0 + r < t;
    const bf16* from = in ? src + (row0 + r) * stride + v * 8 : src;  // not read when out
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(dst + r * (HD + kPadB) + v * 8)),
                 "l"(from), "r"(in ? 16 : 0));
  }
}
// Closes the group of the copies started since the last one.
__device__ inline void CommitLoads() { asm volatile("cp.async.commit_group;\n"); }
// Waits until at most `pending` groups are still in flight.
template <int pending>
__device__ inline void WaitLoads() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// ---- Warp-level mma ([Note: mma fragments]) ------------------------------------

using Acc = float[4];  // one 16 x 8 fp32 tile

__device__ inline void LdMatrix(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

__device__ inline void LdMatrixTransposed(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

// d += a b for one 16 x 8 tile.
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values rounded to bf16 (to nearest even), `lo` in the low half:
// the order of a fragment register.
__device__ inline uint32_t PackBF16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ inline float LowBF16(uint32_t x) { return __uint_as_float(x << 16); }
__device__ inline float HighBF16(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// The A fragment of rows [16 w, 16 w + 16), columns [16 s, 16 s + 16) of a
// row-major tile with leading dimension ld.
__device__ inline void LoadA(uint32_t (&a)[4], const bf16* tile, int ld, int w, int s) {
  const int lane = threadIdx.x % 32;
  LdMatrix(a, tile + (16 * w + lane % 16) * ld + 16 * s + (lane / 16) * 8);
}

// acc[n] += A (16 x 16 at step s) times B for the 16 x 8 tiles n = 2 p,
// 2 p + 1, where B^T is stored (n, k) row-major: B's columns [16 p, 16 p + 16)
// are the tile's rows, its rows [16 s, 16 s + 16) the tile's columns.
__device__ inline void MmaTransposedB(Acc* acc, const uint32_t (&a)[4], const bf16* tile, int ld, int s, int p) {
  const int lane = threadIdx.x % 32;
  uint32_t b[4];
  LdMatrix(b, tile + (16 * p + lane % 8 + (lane / 16) * 8) * ld + 16 * s + ((lane / 8) % 2) * 8);
  Mma(acc[2 * p], a, b[0], b[1]);
  Mma(acc[2 * p + 1], a, b[2], b[3]);
}

// The same, with B stored (k, n) row-major: rows [16 s, 16 s + 16),
// columns [16 p, 16 p + 16) of the tile.
__device__ inline void MmaB(Acc* acc, const uint32_t (&a)[4], const bf16* tile, int ld, int s, int p) {
  const int lane = threadIdx.x % 32;
  uint32_t b[4];
  LdMatrixTransposed(b, tile + (16 * s + lane % 8 + ((lane / 8) % 2) * 8) * ld + 16 * p + (lane / 16) * 8);
  Mma(acc[2 * p], a, b[0], b[1]);
  Mma(acc[2 * p + 1], a, b[2], b[3]);
}

// s[n] = rows [16 w, 16 w + 16) of `a` times the 64 rows of `b`, transposed:
// a warp's 16 x 64 slice of A B^T, both (64, HD) tiles in shared memory.
template <int HD>
__device__ inline void SliceTimesTransposed(const bf16* a, const bf16* b, int w, Acc (&s)[kTile / 8]) {
  constexpr int ld = HD + kPadB;
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    uint32_t fa[4];
    LoadA(fa, a, ld, w, k);
#pragma unroll
    for (int p = 0; p < kTile / 16; ++p) MmaTransposedB(s, fa, b, ld, k, p);
  }
}

// acc += P B: P a warp's 16 x 64 slice as bf16 A fragments (one per 16-deep
// step), B a (64, HD) tile in shared memory.
template <int HD>
__device__ inline void SliceTimesTile(const uint32_t (&p)[kSteps][4], const bf16* b, Acc (&acc)[HD / 8]) {
  constexpr int ld = HD + kPadB;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) MmaB(acc, p[s], b, ld, s, n);
  }
}

// Element e of 16 x 8 tile n of a warp's slice: its row (0 .. 15) and column.
__device__ inline int SliceRow(int e) { return (threadIdx.x % 32) / 4 + (e / 2) * 8; }
__device__ inline int SliceColumn(int n, int e) { return n * 8 + (threadIdx.x % 4) * 2 + e % 2; }

// Values x[n][e] of a 16 x 64 slice, rounded to bf16, as the A fragments
// of the four 16-deep steps that multiply it (c0 c1 | c2 c3 of tiles 2s
// and 2s + 1 are a0 | a1 and a2 | a3).
__device__ inline void SliceToA(const Acc (&x)[kTile / 8], uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      a[s][2 * half] = PackBF16(x[2 * s + half][0], x[2 * s + half][1]);
      a[s][2 * half + 1] = PackBF16(x[2 * s + half][2], x[2 * s + half][3]);
    }
  }
}

// Writes a warp's 16 x HD accumulators times `scale` as bf16 rows
// dst(r) (r = 0 .. 15; nullptr for rows past t), two values a store.
template <int HD, typename RowFn>
__device__ void WriteSlice(const Acc (&acc)[HD / 8], float scale, RowFn dst) {
  const int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    bf16* row = dst(g + 8 * half);
    if (row == nullptr) continue;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<uint32_t*>(row + n * 8 + 2 * q) =
          PackBF16(acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale);
    }
  }
}

// The sum (or max) over the four lanes that hold a row of a slice.
__device__ inline float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}
__device__ inline float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

// ---- Forward ------------------------------------------------------------------

template <int HD>
constexpr int kForwardSmem = SmemBytes<HD>(5, 0);  // Q; K and V twice (one tile lands while one is used)

template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionForwardKernel(const bf16* qkv, bf16* out, float* lse, Shape sh, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = HD + kPadB;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* kv_s = q_s + kTile * ld;  // buffer u: K at kv_s + 2 u kTile ld, V after it
  const int warp = threadIdx.x / 32;

  // The longest rows (last query tiles) start first.
  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t q0 = qt * kTile;
  const int64_t stride = 3 * sh.c;

  auto load_kv = [&](int64_t kt) {
    bf16* k_s = kv_s + (kt % 2) * 2 * kTile * ld;
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, kt * kTile, sh.t, k_s);
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, kt * kTile, sh.t, k_s + kTile * ld);
    CommitLoads();
  };
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
  CommitLoads();
  load_kv(0);
  WaitLoads<1>();  // Q
  __syncthreads();
  uint32_t qf[HD / 16][4];  // this warp's 16 query rows, held for every key tile
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) LoadA(qf[k], q_s, ld, warp, k);

  Acc o[HD / 8];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    // The next tile lands in the other buffer while this one is used.
    if (kt < qt) {
      load_kv(kt + 1);
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    const bf16* k_s = kv_s + (kt % 2) * 2 * kTile * ld;
    const bf16* v_s = k_s + kTile * ld;

    Acc s[kTile / 8];
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < HD / 16; ++k) {
#pragma unroll
      for (int p = 0; p < kTile / 16; ++p) MmaTransposedB(s, qf[k], k_s, ld, k, p);
    }

    // Scores in log2 units, causal mask, each row's running max.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = q0 + 16 * warp + SliceRow(e), j = k0 + SliceColumn(n, e);
        const float x = j <= i && j < sh.t ? s[n][e] * scale_log2 : -INFINITY;
        s[n][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    }
    float m_use[2], correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(tile_max[r]));
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
      correction[r] = exp2f(m[r] - m_use[r]);         // 0 on the first tile
      m[r] = m_new;
    }
    // P, rounded to bf16; l sums what P V multiplies.
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = exp2f(s[n][e] - m_use[e / 2]);
    }
    uint32_t pf[kSteps][4];
    SliceToA(s, pf);
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) sum[reg % 2] += LowBF16(pf[st][reg]) + HighBF16(pf[st][reg]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * correction[r] + QuadSum(sum[r]);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= correction[0];
      o[n][1] *= correction[0];
      o[n][2] *= correction[1];
      o[n][3] *= correction[1];
    }
    SliceTimesTile<HD>(pf, v_s, o);
    __syncthreads();  // this buffer is free for tile kt + 2
  }

  // out = O / l, one scale per row: rows g and g + 8 of the slice.
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const float inv0 = 1.0f / l[0], inv1 = 1.0f / l[1];
    o[n][0] *= inv0;
    o[n][1] *= inv0;
    o[n][2] *= inv1;
    o[n][3] *= inv1;
  }
  WriteSlice<HD>(o, 1.0f, [&](int r) -> bf16* {
    const int64_t i = q0 + 16 * warp + r;
    return i < sh.t ? out + sh.Out(b, i, h, HD) : nullptr;
  });
  if (threadIdx.x % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = q0 + 16 * warp + SliceRow(2 * r);
      if (i < sh.t) lse[blockIdx.y * sh.t + i] = m[r] * kLn2 + logf(l[r]);
    }
  }
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
constexpr int kBackwardSmem = SmemBytes<HD>(6, 4 * kTile);  // two own tiles; two streamed, twice; lse, delta twice

// dK and dV for one 64-key tile: K, V stay; query tiles stream through
// Q, dO. A warp's slice is 16 keys x 64 queries: S^T = K Q^T, dP^T = V dO^T.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionBackwardKeyValueKernel(const bf16* qkv, const bf16* dout, const float* lse,
                                      const float* delta, bf16* dqkv, Shape sh, float scale,
                                      float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = HD + kPadB;
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = k_s + kTile * ld;
  bf16* stream_s = v_s + kTile * ld;  // buffer u: Q at stream_s + 2 u kTile ld, dO after it
  float* stats_s = reinterpret_cast<float*>(stream_s + 4 * kTile * ld);  // buffer u: lse, delta at 2 u kTile
  const int warp = threadIdx.x / 32;

  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t kt = blockIdx.x;  // the first key tiles see the most queries
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t k0 = kt * kTile;
  const int64_t stride = 3 * sh.c;
  // Query tile qt's Q and dO (copies) and its lse, delta (stores) into buffer qt % 2.
  auto load_queries = [&](int64_t qt) {
    const int64_t q0 = qt * kTile;
    bf16* q_s = stream_s + (qt % 2) * 2 * kTile * ld;
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
    LoadTile<HD>(dout + sh.Out(b, 0, h, HD), sh.c, q0, sh.t, q_s + kTile * ld);
    CommitLoads();
    float* lse_s = stats_s + (qt % 2) * 2 * kTile;
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const bool in = q0 + e < sh.t;
      lse_s[e] = in ? lse[blockIdx.y * sh.t + q0 + e] * kLog2E : 0.0f;
      lse_s[kTile + e] = in ? delta[blockIdx.y * sh.t + q0 + e] : 0.0f;
    }
  };
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, k0, sh.t, k_s);
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, k0, sh.t, v_s);
  CommitLoads();
  load_queries(kt);

  Acc dk[HD / 8], dv[HD / 8];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  for (int64_t qt = kt; qt < tiles; ++qt) {
    const int64_t q0 = qt * kTile;
    if (qt + 1 < tiles) {
      load_queries(qt + 1);
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    const bf16* q_s = stream_s + (qt % 2) * 2 * kTile * ld;
    const bf16* do_s = q_s + kTile * ld;
    const float* lse_s = stats_s + (qt % 2) * 2 * kTile;
    const float* delta_s = lse_s + kTile;

    // P^T, then dV += P^T dO (P rounded to bf16).
    Acc p[kTile / 8];
    SliceTimesTransposed<HD>(k_s, q_s, warp, p);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = k0 + 16 * warp + SliceRow(e);
        const int c = SliceColumn(n, e);
        const int64_t i = q0 + c;
        const bool live = j <= i && i < sh.t && j < sh.t;
        p[n][e] = live ? exp2f(p[n][e] * scale_log2 - lse_s[c]) : 0.0f;
      }
    }
    {
      uint32_t pf[kSteps][4];
      SliceToA(p, pf);
      SliceTimesTile<HD>(pf, do_s, dv);
    }
    // dS^T = P^T (dP^T - delta), then dK += dS^T Q (dS rounded to bf16).
    Acc ds[kTile / 8];
    SliceTimesTransposed<HD>(v_s, do_s, warp, ds);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[n][e] = p[n][e] * (ds[n][e] - delta_s[SliceColumn(n, e)]);
    }
    uint32_t dsf[kSteps][4];
    SliceToA(ds, dsf);
    SliceTimesTile<HD>(dsf, q_s, dk);
    __syncthreads();  // this buffer is free for tile qt + 2
  }
  auto row_of = [&](int part) {
    return [&, part](int r) -> bf16* {
      const int64_t j = k0 + 16 * warp + r;
      return j < sh.t ? dqkv + sh.Qkv(b, j, part, h, HD) : nullptr;
    };
  };
  WriteSlice<HD>(dk, scale, row_of(1));
  WriteSlice<HD>(dv, 1.0f, row_of(2));
}

// dQ for one 64-query tile: Q, dO stay; key tiles up to the diagonal stream
// through K, V. S = Q K^T, dP = dO V^T.
template <int HD>
__global__ void __launch_bounds__(kBlockThreads)
    TcAttentionBackwardQueryKernel(const bf16* qkv, const bf16* dout, const float* lse,
                                   const float* delta, bf16* dqkv, Shape sh, float scale,
                                   float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = HD + kPadB;
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* do_s = q_s + kTile * ld;
  bf16* kv_s = do_s + kTile * ld;  // buffer u: K at kv_s + 2 u kTile ld, V after it
  const int warp = threadIdx.x / 32;

  const int64_t tiles = (sh.t + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / sh.heads;
  const int h = blockIdx.y % sh.heads;
  const int64_t q0 = qt * kTile;
  const int64_t stride = 3 * sh.c;
  auto load_kv = [&](int64_t kt) {
    bf16* k_s = kv_s + (kt % 2) * 2 * kTile * ld;
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 1, h, HD), stride, kt * kTile, sh.t, k_s);
    LoadTile<HD>(qkv + sh.Qkv(b, 0, 2, h, HD), stride, kt * kTile, sh.t, k_s + kTile * ld);
    CommitLoads();
  };
  LoadTile<HD>(qkv + sh.Qkv(b, 0, 0, h, HD), stride, q0, sh.t, q_s);
  LoadTile<HD>(dout + sh.Out(b, 0, h, HD), sh.c, q0, sh.t, do_s);
  CommitLoads();
  load_kv(0);
  float lse_r[2], delta_r[2];  // rows g and g + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = q0 + 16 * warp + SliceRow(2 * r);
    lse_r[r] = i < sh.t ? lse[blockIdx.y * sh.t + i] * kLog2E : 0.0f;
    delta_r[r] = i < sh.t ? delta[blockIdx.y * sh.t + i] : 0.0f;
  }

  Acc dq[HD / 8];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    if (kt < qt) {
      load_kv(kt + 1);
      WaitLoads<1>();
    } else {
      WaitLoads<0>();
    }
    __syncthreads();
    const bf16* k_s = kv_s + (kt % 2) * 2 * kTile * ld;
    const bf16* v_s = k_s + kTile * ld;

    Acc p[kTile / 8], ds[kTile / 8];
    SliceTimesTransposed<HD>(q_s, k_s, warp, p);
    SliceTimesTransposed<HD>(do_s, v_s, warp, ds);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = q0 + 16 * warp + SliceRow(e), j = k0 + SliceColumn(n, e);
        const bool live = j <= i && i < sh.t && j < sh.t;
        const float pe = live ? exp2f(p[n][e] * scale_log2 - lse_r[e / 2]) : 0.0f;
        ds[n][e] = pe * (ds[n][e] - delta_r[e / 2]);
      }
    }
    uint32_t dsf[kSteps][4];
    SliceToA(ds, dsf);
    SliceTimesTile<HD>(dsf, k_s, dq);
    __syncthreads();  // this buffer is free for tile kt + 2
  }
  WriteSlice<HD>(dq, scale, [&](int r) -> bf16* {
    const int64_t i = q0 + 16 * warp + r;
    return i < sh.t ? dqkv + sh.Qkv(b, i, 0, h, HD) : nullptr;
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
  return major >= 8;  // bf16 mma.sync
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
    return Launch(TcAttentionForwardKernel<64>, grid, kForwardSmem<64>, s, q, o, lse, sh, scale_log2);
  }
  return Launch(TcAttentionForwardKernel<128>, grid, kForwardSmem<128>, s, q, o, lse, sh,
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
    const int bytes = kBackwardSmem<kHd>;
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
