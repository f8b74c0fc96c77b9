// Decode rows' attention over an fp8 e4m3 cache on the tensor cores (kernels/decode_attention.h).
//
// A block per (row, KV head). Its four warps take every fourth run of 16 tokens of the row's context, each streaming
// its runs through shared memory (cp.async, kStages in flight) with an online softmax of its own; the warps merge
// through shared memory at the end. (Runs split over a cluster of 2–4 blocks per row, merged through distributed
// shared memory, measured slower at every batch of 32–256 rows: kernels/NOTES.md.) The group's query heads are the rows
// of mma.sync m16n8k16 (rows 8–15 stay empty); K and V enter as f16, each e4m3 pair converted exactly by one
// instruction, and q is rounded to f16 once.
//
// The operands come from ldmatrix over the e4m3 bytes taken as 16-bit pairs, with the mma's k and n indices
// permuted to fit them (a sum over k does not care in which order its terms come):
// - scores (A = q, B = Kᵀ): ldmatrix gives lane (g, t) = (lane / 4, lane % 4) dims 4t .. 4t+3 of token g of an
//   8-token, 16-dim block; they are its k 2t, 2t+1 (dims 4t, 4t+1) and 2t+8, 2t+9 (dims 4t+2, 4t+3), and q's
//   fragment holds the same dims at the same k;
// - P·V (A = P, B = V): ldmatrix.trans gives lane (g, t) dims 2g, 2g+1 of tokens 2t and 2t+1; byte permutes split
//   them into the B fragments of two n-tiles, one of the block's even dims and one of its odd dims, so that the
//   lane's outputs are dims 4t .. 4t+3 of every 16-dim block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/decode_attention.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/fp8.h"
#include "kernels/gemv_tiles.cuh"  // Fp8PairToHalf2

namespace inferd::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRun = 16;     // tokens of a run: the k of one P·V product
constexpr int kStages = 3;   // a warp's runs in flight
constexpr int kMmaRows = 8;  // the mma rows a group fills (rows 8–15 are empty)
static_assert(kDecodeAttentionMaxGroup <= kMmaRows);

// Shared memory of one block: each warp's kStages runs of K rows then V rows (a token's D bytes padded by 16, so that
// the eight rows an ldmatrix reads fall in different banks); after the last run the same bytes hold each warp's
// unnormalised output rows (fp32), maxima and sums for the merge.
template <int D>
struct RunSmem {
  static constexpr int kRow = D + 16;
  static constexpr int kRunBytes = 2 * kRun * kRow;
  static constexpr int kWarpBytes = kStages * kRunBytes;
  static constexpr int kBytes = kWarps * kWarpBytes;
  static_assert(kWarps * (kMmaRows * D + 2 * kMmaRows) * 4 <= kBytes);
};

__device__ __forceinline__ uint32_t Half2Bits(__half2 h) {
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d (rows g of the tile) += A · B, m16n8k16 with f16 operands and fp32 sums; A's rows 8–15 are zero, so their sums
// are dropped (gemv_tiles.cuh's Mma16816 keeps them: 32 more registers a lane at head dim 128). a0, a2:
// A's k 2t..2t+1 and 2t+8..2t+9 of row g; b0, b1: B's fragment.
__device__ __forceinline__ void MmaTopRows(float (&d)[2], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float dropped[2] = {0.f, 0.f};
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %5}, {%7, %8}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(dropped[0]), "+f"(dropped[1])
      : "r"(a0), "r"(0u), "r"(a2), "r"(b0), "r"(b1));
#endif
}

// Four 8 × 8 matrices of 16-bit elements (transposed: each lane gets a column's pair, not a row's); lanes
// 8m .. 8m+7 give matrix m's row addresses.
template <bool kTransposed>
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kTransposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#endif
}

// Grid (rows, KV heads). Scores are in log2 units (q scaled by sm_scale · log2 e).
template <int D>
__global__ void __launch_bounds__(kThreads, D == 128 ? 3 : 2)
    DecodeAttentionFp8Kernel(const __nv_bfloat16* __restrict__ q, int64_t q_stride, const Fp8* __restrict__ k_cache,
                             const Fp8* __restrict__ v_cache, const int32_t* __restrict__ kv_indptr,
                             const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ last_len,
                             __nv_bfloat16* __restrict__ out, int32_t num_qo_heads, int32_t num_kv_heads,
                             int32_t page_size, float q_scale, float v_scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using S = RunSmem<D>;
  constexpr int kBlocks = D / 16;  // 16-dim blocks of a head
  const int row = blockIdx.x, kvh = blockIdx.y;
  const int group = num_qo_heads / num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  extern __shared__ uint4 smem[];
  char* const base = reinterpret_cast<char*>(smem);
  char* const mine = base + warp * S::kWarpBytes;

  // The page table is the step's input, copied in before the step's first kernel; q and the newest token's K/V come
  // from the kernel before (RoPE's), so the runs wait for it.
  const int32_t first_page = kv_indptr[row], pages = kv_indptr[row + 1] - first_page;
  const int32_t len = pages > 0 ? (pages - 1) * page_size + last_len[row] : 0;
  const int32_t runs = (len + kRun - 1) / kRun;
  const int32_t my_runs = runs > warp ? (runs - warp + kWarps - 1) / kWarps : 0;  // runs warp, warp + 4, …
  const int64_t kv_dim = int64_t{num_kv_heads} * D;
  // The warp's i-th run into a stage: lane e takes 16-byte chunks e, e + 32, … of the run's K rows and V rows;
  // tokens past the context are zeros (an e4m3 byte can be NaN, and a zero probability times NaN is NaN).
  auto load_run = [&](int32_t i, int stage) {
    const int32_t t0 = (warp + i * kWarps) * kRun;
    char* ks = mine + stage * S::kRunBytes;
    char* vs = ks + kRun * S::kRow;
    if (page_size % kRun == 0) {  // the run lies in one page: one look-up
      const int64_t page = kv_indices[first_page + t0 / page_size];
      const int64_t run_at = (page * page_size + t0 % page_size) * kv_dim + int64_t{kvh} * D;
#pragma unroll
      for (int e = lane; e < kRun * kBlocks; e += 32) {
        const int j = e / kBlocks, c = e % kBlocks;
        const bool valid = t0 + j < len;
        const int64_t at = valid ? run_at + j * kv_dim + c * 16 : 0;
        CopyAsync16(ks + j * S::kRow + c * 16, k_cache + at, valid);
        CopyAsync16(vs + j * S::kRow + c * 16, v_cache + at, valid);
      }
      return;
    }
#pragma unroll
    for (int e = lane; e < kRun * kBlocks; e += 32) {
      const int j = e / kBlocks, c = e % kBlocks;
      const int32_t tok = t0 + j;
      const bool valid = tok < len;
      int64_t at = 0;
      if (valid) {
        const int64_t page = kv_indices[first_page + tok / page_size];
        at = (page * page_size + tok % page_size) * kv_dim + int64_t{kvh} * D + c * 16;
      }
      CopyAsync16(ks + j * S::kRow + c * 16, k_cache + at, valid);
      CopyAsync16(vs + j * S::kRow + c * 16, v_cache + at, valid);
    }
  };
  WaitForPrerequisites();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_runs) load_run(s, s);
    CommitCopies();
  }
  // q's A fragments: row g is query head kvh · group + g (zeros past the group), in log2 units, rounded to f16
  // (saturating: f16 overflows past 65504, far past any query seen).
  uint32_t qa[kBlocks][2];
  {
    const __nv_bfloat16* qr = q + int64_t{row} * q_stride + (int64_t{kvh} * group + g) * D + 4 * t;
    auto scaled = [&](float v) { return fminf(fmaxf(v * q_scale, -65504.f), 65504.f); };
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (g < group) {
        const uint2 raw = *reinterpret_cast<const uint2*>(qr + 16 * b);
        const auto* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
        for (int x = 0; x < 4; ++x) v[x] = F(e[x]);
      }
      qa[b][0] = Half2Bits(__floats2half2_rn(scaled(v[0]), scaled(v[1])));
      qa[b][1] = Half2Bits(__floats2half2_rn(scaled(v[2]), scaled(v[3])));
    }
  }

  float m = -INFINITY, l = 0.f;  // row g's running maximum, and the lane's share of its sum
  float o[kBlocks][2][2];        // [block][n-tile of its even, odd dims][the lane's two columns]
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
    for (int n = 0; n < 2; ++n) o[b][n][0] = o[b][n][1] = 0.f;
  }
  // This lane's ldmatrix row: matrix lane / 8 is token half (lane / 8) & 1 of block +(lane / 16), row lane % 8.
  const int mat = lane / 8;
  const uint32_t lane_row =
      static_cast<uint32_t>(__cvta_generic_to_shared(mine)) + ((mat & 1) * 8 + lane % 8) * S::kRow + (mat >> 1) * 16;
#pragma unroll 1
  for (int32_t i = 0; i < my_runs; ++i) {
    if (i + kStages - 1 < my_runs) load_run(i + kStages - 1, (i + kStages - 1) % kStages);
    CommitCopies();
    WaitCopies<kStages - 1>();  // this lane's copies of run i
    __syncwarp();               // and the other lanes'
    const uint32_t ks = lane_row + (i % kStages) * S::kRunBytes;
    const uint32_t vs = ks + kRun * S::kRow;
    // Scores of the run's tokens 8h + 2t and 8h + 2t + 1 for row g.
    float s[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int b = 0; b < kBlocks; b += 2) {
      uint32_t r[4];  // r[x]: token half x & 1 of block b + x / 2
      LoadMatrices<false>(r, ks + b * 16);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        MmaTopRows(s[x & 1], qa[b + x / 2][0], qa[b + x / 2][1], Fp8PairToHalf2(r[x], 0), Fp8PairToHalf2(r[x], 1));
      }
    }
    const int32_t t0 = (warp + i * kWarps) * kRun;
    float top = m;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (t0 + 8 * h + 2 * t + e >= len) s[h][e] = -INFINITY;
        top = fmaxf(top, s[h][e]);
      }
    }
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));  // finite: the run's first token is in the context
    const float alpha = exp2f(m - top);
    m = top;
    float p[2][2], sum = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[h][e] = exp2f(s[h][e] - top);
        sum += p[h][e];
      }
    }
    l = l * alpha + sum;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        o[b][n][0] *= alpha;
        o[b][n][1] *= alpha;
      }
    }
    const uint32_t pa0 = Half2Bits(__floats2half2_rn(p[0][0], p[0][1]));
    const uint32_t pa2 = Half2Bits(__floats2half2_rn(p[1][0], p[1][1]));
#pragma unroll
    for (int b = 0; b < kBlocks; b += 2) {
      uint32_t r[4];  // r[x]: token half x & 1 of block b + x / 2, transposed
      LoadMatrices<true>(r, vs + b * 16);
#pragma unroll
      for (int y = 0; y < 2; ++y) {
        const uint32_t lo = r[2 * y], hi = r[2 * y + 1];  // bytes: (token 2t: dim 2g, 2g+1), (token 2t+1: same)
        MmaTopRows(o[b + y][0], pa0, pa2, Fp8PairToHalf2(__byte_perm(lo, 0, 0x0020), 0),
                   Fp8PairToHalf2(__byte_perm(hi, 0, 0x0020), 0));
        MmaTopRows(o[b + y][1], pa0, pa2, Fp8PairToHalf2(__byte_perm(lo, 0, 0x0031), 0),
                   Fp8PairToHalf2(__byte_perm(hi, 0, 0x0031), 0));
      }
    }
    __syncwarp();  // every lane is done with the stage the next run's copies overwrite
  }
  WaitCopies<0>();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();                              // every warp is done with its stages, which the merge takes over
  float* o_s = reinterpret_cast<float*>(base);  // [warp][row][D]
  float* m_s = o_s + kWarps * kMmaRows * D;     // [warp][row]
  float* l_s = m_s + kWarps * kMmaRows;
  if (g < group) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      *reinterpret_cast<float4*>(o_s + (warp * kMmaRows + g) * D + 16 * b + 4 * t) =
          make_float4(o[b][0][0], o[b][1][0], o[b][0][1], o[b][1][1]);
    }
    if (t == 0) {
      m_s[warp * kMmaRows + g] = m;
      l_s[warp * kMmaRows + g] = l;
    }
  }
  __syncthreads();
  const int64_t out_row = int64_t{row} * num_qo_heads * D + int64_t{kvh} * group * D;
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, m_s[w * kMmaRows + r]);
    float sum = 0.f, acc = 0.f;
    if (top != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = m_s[w * kMmaRows + r];
        if (mw == -INFINITY) continue;  // a warp without runs
        const float weight = exp2f(mw - top);
        sum += l_s[w * kMmaRows + r] * weight;
        acc += o_s[(w * kMmaRows + r) * D + d] * weight;
      }
    }
    out[out_row + idx] = To<__nv_bfloat16>(sum > 0.f ? acc / sum * v_scale : 0.f);
  }
#endif
}

template <int D>
cudaError_t LaunchFp8(const __nv_bfloat16* q, int64_t q_stride, const Fp8* k_cache, const Fp8* v_cache,
                      const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* last_len, __nv_bfloat16* out,
                      int32_t rows, int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size, float sm_scale,
                      float v_scale, bool early_launch, cudaStream_t stream) {
  auto* kernel = DecodeAttentionFp8Kernel<D>;
  constexpr int kBytes = RunSmem<D>::kBytes;
  // Once per device and thread (a tensor-parallel rank keeps its thread and its GPU): the shared memory allowed.
  thread_local int set_for_device = -1;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (set_for_device != device) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
        e != cudaSuccess) {
      return e;
    }
    set_for_device = device;
  }
  constexpr float kLog2e = 1.4426950408889634f;
  return LaunchMaybeDependent(early_launch, kernel,
                              dim3(static_cast<unsigned>(rows), static_cast<unsigned>(num_kv_heads)), dim3(kThreads),
                              kBytes, stream, q, q_stride, k_cache, v_cache, kv_indptr, kv_indices, last_len, out,
                              num_qo_heads, num_kv_heads, page_size, sm_scale * kLog2e, v_scale);
}

}  // namespace

bool DecodeAttentionFp8Supports(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim) {
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0 || num_qo_heads / num_kv_heads > kDecodeAttentionMaxGroup) {
    return false;
  }
  if (head_dim != 128 && head_dim != 256) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 8;  // mma.sync with f16, ldmatrix and cp.async
}

cudaError_t RunDecodeAttentionFp8(const __nv_bfloat16* q, int64_t q_row_stride, const Fp8* k_cache, const Fp8* v_cache,
                                  const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len,
                                  __nv_bfloat16* out, int32_t num_rows, int32_t num_qo_heads, int32_t num_kv_heads,
                                  int32_t head_dim, int32_t page_size, float sm_scale, float v_scale, bool early_launch,
                                  cudaStream_t stream) {
  if (num_rows < 0 || page_size <= 0 || q_row_stride % 4 != 0 ||
      !DecodeAttentionFp8Supports(num_qo_heads, num_kv_heads, head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  return head_dim == 128
             ? LaunchFp8<128>(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, num_rows,
                              num_qo_heads, num_kv_heads, page_size, sm_scale, v_scale, early_launch, stream)
             : LaunchFp8<256>(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, num_rows,
                              num_qo_heads, num_kv_heads, page_size, sm_scale, v_scale, early_launch, stream);
}

}  // namespace inferd::kernels
