#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cp_async.cuh"
#include "kernels/decode_attention.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"

namespace inferd::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;  // 4 warps; warp w holds query heads w and w + 4 of the group
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;       // tokens a stage of the pipeline holds (a lane each when scoring)
constexpr int kStages = 3;      // tiles in flight
constexpr int kMaxSplits = 16;  // blocks per cluster (16 needs the non-portable cluster size)
constexpr int kHeadsPerWarp = kDecodeAttentionMaxGroup / kWarps;

// Shared memory of one block: kStages tiles of K and V rows (each row padded by 16 bytes, so that the lanes of a warp
// reading one column of 8 rows hit different banks), the group's query rows in fp32, each head's probabilities for
// the tile, and the block's partial result (unnormalised output, running max and sum per head) the cluster merges.
template <typename T, int D>
struct Smem {
  static constexpr int kRow = D + 8;
  static constexpr size_t kKv = size_t{kStages} * 2 * kTile * kRow * sizeof(T);
  static constexpr size_t kQ = size_t{kDecodeAttentionMaxGroup} * D * sizeof(float);
  static constexpr size_t kP = size_t{kDecodeAttentionMaxGroup} * kTile * sizeof(float);
  static constexpr size_t kO = kQ;
  static constexpr size_t kBytes = kKv + kQ + kP + kO + 2 * kDecodeAttentionMaxGroup * sizeof(float);
};

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid (splits, num_kv_heads, rows), clusters of (splits, 1, 1): block `split` of the cluster for (row, KV head)
// takes the split-th run of the row's tokens. Scores are in log2 units (q pre-scaled by sm_scale · log2 e).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionKernel(const T* __restrict__ q, int64_t q_stride, const T* __restrict__ k_cache,
                          const T* __restrict__ v_cache, const int32_t* __restrict__ kv_indptr,
                          const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ last_len,
                          T* __restrict__ out, int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size,
                          float q_scale, float cap_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = Smem<T, D>;
  using P = Pair<T>;
  constexpr int kChunks = D / 8;    // 16-byte pieces of a row
  constexpr int kPerLane = D / 32;  // output dims a lane accumulates
  const cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.block_rank()), splits = static_cast<int>(cluster.num_blocks());
  const int kvh = blockIdx.y, row = blockIdx.z;
  const int group = num_qo_heads / num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  extern __shared__ uint4 smem[];
  T* kv_s = reinterpret_cast<T*>(smem);
  float* q_s = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + S::kKv);
  float* p_s = q_s + kDecodeAttentionMaxGroup * D;
  float* o_s = p_s + kDecodeAttentionMaxGroup * kTile;
  float* m_s = o_s + kDecodeAttentionMaxGroup * D;
  float* l_s = m_s + kDecodeAttentionMaxGroup;

  // The page table is the step's input, copied in before the step's first kernel, and every kernel of the chain
  // before this one started after that one did: it is read before the wait, and so are the K/V rows of earlier
  // steps. q and the newest token's K/V come from the kernel before (RoPE's), after the wait.
  const int32_t first_page = kv_indptr[row], pages = kv_indptr[row + 1] - first_page;
  const int32_t len = pages > 0 ? (pages - 1) * page_size + last_len[row] : 0;
  const int32_t chunk = (len + splits - 1) / splits;
  const int32_t begin = min(len, split * chunk), end = min(len, begin + chunk);
  const int32_t tiles = (end - begin + kTile - 1) / kTile;

  const int64_t kv_dim = int64_t{num_kv_heads} * D;
  // Tile t0's rows into a stage; `skip`: a token left out (its row is neither read nor zeroed).
  auto load_tile = [&](int32_t t0, int stage, int32_t skip) {
    T* ks = kv_s + stage * 2 * kTile * S::kRow;
    T* vs = ks + kTile * S::kRow;
    for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
      const int j = i / kChunks, c = i % kChunks;
      const int32_t t = t0 + j;
      if (t == skip) continue;
      const bool valid = t < end;
      int64_t at = 0;
      if (valid) {
        const int32_t page = kv_indices[first_page + t / page_size];
        at = (int64_t{page} * page_size + t % page_size) * kv_dim + int64_t{kvh} * D + c * 8;
      }
      CopyAsync16(ks + j * S::kRow + c * 8, k_cache + at, valid);
      CopyAsync16(vs + j * S::kRow + c * 8, v_cache + at, valid);
    }
  };
  // The first tiles stream in while RoPE's kernel may still run, all but the newest token's row, which follows the
  // wait in a group of its own.
  const int32_t newest = len - 1;
  const bool newest_early = newest >= begin && newest < end && (newest - begin) / kTile < kStages - 1;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(begin + s * kTile, s, newest);
    CommitCopies();
  }
  WaitForPrerequisites();
  AllowDependentsToLaunch();  // the o product streams its weights meanwhile
  if (newest_early) {
    const int32_t j = newest - begin;
    for (int c = threadIdx.x; c < kChunks; c += kThreads) {
      const int32_t page = kv_indices[first_page + newest / page_size];
      const int64_t at = (int64_t{page} * page_size + newest % page_size) * kv_dim + int64_t{kvh} * D + c * 8;
      T* ks = kv_s + (j / kTile) * 2 * kTile * S::kRow + (j % kTile) * S::kRow;
      CopyAsync16(ks + c * 8, k_cache + at, true);
      CopyAsync16(ks + kTile * S::kRow + c * 8, v_cache + at, true);
    }
  }
  CommitCopies();
  for (int i = threadIdx.x; i < group * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[i] = F(q[row * q_stride + (int64_t{kvh} * group + g) * D + d]) * q_scale;
  }

  float m[kHeadsPerWarp], l[kHeadsPerWarp], o[kHeadsPerWarp][kPerLane];
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int d = 0; d < kPerLane; ++d) o[h][d] = 0.f;
  }
  for (int32_t tile = 0; tile < tiles; ++tile) {
    if (tile == 0) {
      WaitCopies<0>();  // the first tiles and the newest row
    } else {
      WaitCopies<kStages - 2>();  // this thread's copies of the tile (the groups after its own: the tiles after it)
    }
    __syncthreads();  // everyone's; the stage the next load overwrites is done with
    if (tile + kStages - 1 < tiles) {
      load_tile(begin + (tile + kStages - 1) * kTile, (tile + kStages - 1) % kStages, -1);
    }
    CommitCopies();
    const T* ks = kv_s + (tile % kStages) * 2 * kTile * S::kRow;
    const T* vs = ks + kTile * S::kRow;
    const int32_t count = min(kTile, end - (begin + tile * kTile));
    // Scores: lane j scores token j for the warp's heads.
    float score[kHeadsPerWarp];
#pragma unroll
    for (int h = 0; h < kHeadsPerWarp; ++h) score[h] = 0.f;
    if (lane < count) {
#pragma unroll 4
      for (int c = 0; c < kChunks; ++c) {
        const uint4 kv = *reinterpret_cast<const uint4*>(ks + lane * S::kRow + c * 8);
        const auto* kp = reinterpret_cast<const typename P::type*>(&kv);
#pragma unroll
        for (int h = 0; h < kHeadsPerWarp; ++h) {
          const int g = warp + h * kWarps;
          if (g >= group) break;
          const float4* qv = reinterpret_cast<const float4*>(q_s + g * D + c * 8);
          const float4 a = qv[0], b = qv[1];
          const float2 k0 = P::ToFloat2(kp[0]), k1 = P::ToFloat2(kp[1]), k2 = P::ToFloat2(kp[2]),
                       k3 = P::ToFloat2(kp[3]);
          score[h] +=
              a.x * k0.x + a.y * k0.y + a.z * k1.x + a.w * k1.y + b.x * k2.x + b.y * k2.y + b.z * k3.x + b.w * k3.y;
        }
      }
    }
    // Online softmax per head, then the tile's V rows weighted into the lanes' output dims.
#pragma unroll
    for (int h = 0; h < kHeadsPerWarp; ++h) {
      const int g = warp + h * kWarps;
      if (g >= group) break;
      float s = lane < count ? score[h] : -INFINITY;
      if (cap_log2 > 0.f && lane < count) s = tanhf(s) * cap_log2;  // q came scaled by sm_scale / cap
      const float m_new = fmaxf(m[h], WarpMax(s));
      const float p = lane < count ? exp2f(s - m_new) : 0.f;
      const float alpha = exp2f(m[h] - m_new);
      l[h] = l[h] * alpha + WarpSum(p);
      m[h] = m_new;
      p_s[g * kTile + lane] = p;
#pragma unroll
      for (int d = 0; d < kPerLane; ++d) o[h][d] *= alpha;
    }
    __syncwarp();
    if (warp < group) {
      for (int j = 0; j < count; ++j) {
        const auto* vp = reinterpret_cast<const typename P::type*>(vs + j * S::kRow + lane * kPerLane);
        float v[kPerLane];
#pragma unroll
        for (int d = 0; d < kPerLane / 2; ++d) {
          const float2 f = P::ToFloat2(vp[d]);
          v[2 * d] = f.x;
          v[2 * d + 1] = f.y;
        }
#pragma unroll
        for (int h = 0; h < kHeadsPerWarp; ++h) {
          const int g = warp + h * kWarps;
          if (g >= group) break;
          const float p = p_s[g * kTile + j];
#pragma unroll
          for (int d = 0; d < kPerLane; ++d) o[h][d] = fmaf(p, v[d], o[h][d]);
        }
      }
    }
  }
  WaitCopies<0>();
  // The block's partial result, then each block of the cluster merges a share of the group's outputs from all.
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const int g = warp + h * kWarps;
    if (g >= group) break;
#pragma unroll
    for (int d = 0; d < kPerLane; ++d) o_s[g * D + lane * kPerLane + d] = o[h][d];
    if (lane == 0) {
      m_s[g] = m[h];
      l_s[g] = l[h];
    }
  }
  cluster.sync();
  const int outputs = group * D, share = (outputs + splits - 1) / splits;
  for (int i = threadIdx.x; i < share && split * share + i < outputs; i += kThreads) {
    const int idx = split * share + i, g = idx / D, d = idx % D;
    float top = -INFINITY;
    for (int b = 0; b < splits; ++b) top = fmaxf(top, cluster.map_shared_rank(m_s, b)[g]);
    float sum = 0.f, acc = 0.f;
    if (top != -INFINITY) {
      for (int b = 0; b < splits; ++b) {
        const float mb = cluster.map_shared_rank(m_s, b)[g];
        if (mb == -INFINITY) continue;  // a block without tokens
        const float w = exp2f(mb - top);
        sum += cluster.map_shared_rank(l_s, b)[g] * w;
        acc += cluster.map_shared_rank(o_s, b)[g * D + d] * w;
      }
    }
    out[int64_t{row} * num_qo_heads * D + (int64_t{kvh} * group + g) * D + d] = To<T>(sum > 0.f ? acc / sum : 0.f);
  }
  cluster.sync();  // the others' shared memory stays until every block has read it
#endif
}

template <typename T, int D>
cudaError_t Launch(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int32_t* kv_indptr,
                   const int32_t* kv_indices, const int32_t* last_len, T* out, int32_t rows, int32_t num_qo_heads,
                   int32_t num_kv_heads, int32_t page_size, float sm_scale, float soft_cap, bool early_launch,
                   cudaStream_t stream) {
  auto* kernel = DecodeAttentionKernel<T, D>;
  constexpr size_t kBytes = Smem<T, D>::kBytes;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kBytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim = {kMaxSplits, 1, 1};
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  config.numAttrs = 1;
  // Once per device (the kernel's attributes belong to the device current when they are set) and thread (a
  // tensor-parallel rank keeps its thread and its GPU): the shared memory and cluster size allowed, the SM count,
  // and whether the device holds a cluster of kMaxSplits blocks (else 8).
  struct DeviceSetup {
    int device = -1, sms = 0, max_splits = 0;
  };
  thread_local DeviceSetup setup;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (setup.device != device) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
        e != cudaSuccess) {
      return e;
    }
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        e != cudaSuccess) {
      return e;
    }
    int sms = 0;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) {
      return e;
    }
    config.gridDim = dim3(kMaxSplits);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) cudaGetLastError();
    setup = {device, sms, clusters >= 1 ? kMaxSplits : 8};
  }
  // About one block per SM: as many splits of each row's tokens as the (row, KV head) pairs leave room for.
  const int64_t pairs = std::max<int64_t>(1, int64_t{rows} * num_kv_heads);
  int splits = setup.max_splits;
  while (splits > 1 && splits * pairs > setup.sms) splits /= 2;
  config.gridDim = dim3(splits, num_kv_heads, rows);
  attrs[0].val.clusterDim.x = splits;
  config.numAttrs = early_launch && DependentLaunchAllowed() ? 2 : 1;
  // Scores in log2 units: q scaled by sm_scale · log2 e, or with a soft cap by sm_scale / cap and tanh's result by
  // cap · log2 e.
  constexpr float kLog2e = 1.4426950408889634f;
  const float q_scale = soft_cap > 0.f ? sm_scale / soft_cap : sm_scale * kLog2e;
  return cudaLaunchKernelEx(&config, kernel, q, q_stride, k_cache, v_cache, kv_indptr, kv_indices, last_len, out,
                            num_qo_heads, num_kv_heads, page_size, q_scale, soft_cap > 0.f ? soft_cap * kLog2e : 0.f);
}

}  // namespace

bool DecodeAttentionSupports(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim) {
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0 || num_qo_heads / num_kv_heads > kDecodeAttentionMaxGroup) {
    return false;
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  int device = 0, clusters = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // Clusters need code compiled for 9.0 or later, which is what DependentLaunchAllowed's probe checks too.
  return clusters != 0 && DependentLaunchAllowed();
}

template <typename T>
cudaError_t RunDecodeAttention(const T* q, int64_t q_row_stride, const T* k_cache, const T* v_cache,
                               const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len,
                               T* out, int32_t num_rows, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                               int32_t page_size, float sm_scale, bool early_launch, cudaStream_t stream,
                               float soft_cap) {
  if (num_rows < 0 || page_size <= 0 || soft_cap < 0.f ||
      !DecodeAttentionSupports(num_qo_heads, num_kv_heads, head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  switch (head_dim) {
    case 64:
      return Launch<T, 64>(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, num_rows,
                           num_qo_heads, num_kv_heads, page_size, sm_scale, soft_cap, early_launch, stream);
    case 128:
      return Launch<T, 128>(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, num_rows,
                            num_qo_heads, num_kv_heads, page_size, sm_scale, soft_cap, early_launch, stream);
    default:
      return Launch<T, 256>(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, num_rows,
                            num_qo_heads, num_kv_heads, page_size, sm_scale, soft_cap, early_launch, stream);
  }
}

template cudaError_t RunDecodeAttention<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const __nv_bfloat16*,
                                                       const __nv_bfloat16*, const int32_t*, const int32_t*,
                                                       const int32_t*, __nv_bfloat16*, int32_t, int32_t, int32_t,
                                                       int32_t, int32_t, float, bool, cudaStream_t, float);
template cudaError_t RunDecodeAttention<__half>(const __half*, int64_t, const __half*, const __half*, const int32_t*,
                                                const int32_t*, const int32_t*, __half*, int32_t, int32_t, int32_t,
                                                int32_t, int32_t, float, bool, cudaStream_t, float);

}  // namespace inferd::kernels
