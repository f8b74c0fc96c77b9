#include <cfloat>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/sampling.h"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kSearchSteps = 48;  // bisection steps for the top-k and top-p thresholds

using BlockReduceF = cub::BlockReduce<float, kThreads>;
using BlockReduceI = cub::BlockReduce<int, kThreads>;

struct SumOp {
  template <typename V>
  __device__ V operator()(const V& a, const V& b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct MinOp {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};

struct ArgMax {
  float value;
  int32_t index;
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index <= b.index ? a : b;
  }
};
using BlockReduceA = cub::BlockReduce<ArgMax, kThreads>;
using BlockScanD = cub::BlockScan<double, kThreads>;

union Shared {
  typename BlockReduceF::TempStorage f;
  typename BlockReduceI::TempStorage i;
  typename BlockReduceA::TempStorage a;
  typename BlockScanD::TempStorage d;
};

// Sum of x over the block, broadcast to every thread.
template <typename R, typename Storage, typename V, typename Op>
__device__ V AllReduce(Storage& storage, V x, Op op, V* slot) {
  V r = R(storage).Reduce(x, op);
  if (threadIdx.x == 0) *slot = r;
  __syncthreads();
  r = *slot;
  __syncthreads();
  return r;
}

__device__ bool IsExcluded(int32_t v, const int32_t* ids, int n) {
  for (int i = 0; i < n; ++i)
    if (ids[i] == v) return true;
  return false;
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(float* logits, int32_t vocab, const SamplingRowParams* params, const int32_t* penalty_indptr,
                     const int32_t* penalty_tokens, const int32_t* penalty_counts, const uint8_t* penalty_flags,
                     const float* penalty_bias, float* penalty_raw, const uint32_t* allowed, int32_t* tokens,
                     float* logprobs, int32_t* top_ids, float* top_logprobs, const uint32_t* masks_ready) {
  __shared__ Shared tmp;
  __shared__ float sf;
  __shared__ int si;
  __shared__ ArgMax sa;
  __shared__ int32_t chosen[kMaxTopLogprobs];
  const int32_t row = blockIdx.x;
  const SamplingRowParams p = params[row];
  float* l = logits + int64_t{row} * vocab;
  const int32_t pb = penalty_indptr[row], pe = penalty_indptr[row + 1];

  // Raw log-softmax normalizer and the top alternatives, before anything changes the logits.
  float log_z = 0.f;
  const int n_top = min(max(p.top_logprobs, 0), min(kMaxTopLogprobs, vocab));
  const bool reports = p.top_logprobs > 0 || p.target >= 0;
  if (reports) {
    float mx = -FLT_MAX;
    for (int32_t v = threadIdx.x; v < vocab; v += kThreads) mx = fmaxf(mx, l[v]);
    mx = AllReduce<BlockReduceF>(tmp.f, mx, MaxOp(), &sf);
    float sum = 0.f;
    for (int32_t v = threadIdx.x; v < vocab; v += kThreads) sum += expf(l[v] - mx);
    sum = AllReduce<BlockReduceF>(tmp.f, sum, SumOp(), &sf);
    log_z = mx + logf(sum);
    for (int k = 0; k < n_top; ++k) {
      ArgMax best{-FLT_MAX, vocab};
      for (int32_t v = threadIdx.x; v < vocab; v += kThreads) {
        if (!IsExcluded(v, chosen, k)) best = ArgMaxOp()(best, ArgMax{l[v], v});
      }
      best = AllReduce<BlockReduceA>(tmp.a, best, ArgMaxOp(), &sa);
      if (threadIdx.x == 0) {
        chosen[k] = best.index;
        top_ids[int64_t{row} * kMaxTopLogprobs + k] = best.index;
        top_logprobs[int64_t{row} * kMaxTopLogprobs + k] = best.value - log_z;
      }
      __syncthreads();
    }
  }

  if (p.target >= 0) {  // a prompt row: the logprob of the token that follows; nothing is sampled
    if (threadIdx.x == 0) {
      tokens[row] = p.target;
      logprobs[row] = l[p.target] - log_z;
    }
    return;
  }

  // Penalties (one entry per distinct id, so no two threads touch one logit).
  for (int32_t e = pb + threadIdx.x; e < pe; e += kThreads) {
    const int32_t t = penalty_tokens[e];
    double v = l[t];  // in double, then back to a finite float: a tiny valid penalty must not make inf (NaN)
    penalty_raw[e] = l[t];
    if ((penalty_flags[e] & kPenaltySeen) && p.repetition_penalty != 1.f) {
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
    if (penalty_counts[e] > 0) v -= double{p.frequency_penalty} * penalty_counts[e] + p.presence_penalty;
    if (penalty_flags[e] & kPenaltyBias) v += penalty_bias[e];
    l[t] = (penalty_flags[e] & kPenaltyBanned) ? -INFINITY : static_cast<float>(fmin(fmax(v, -FLT_MAX), FLT_MAX));
  }
  __syncthreads();
  if (p.masked) {       // structured output: only the tokens the row's constraint allows
    if (masks_ready) {  // once the host's copy of the masks has landed (it sets the word after them)
      if (threadIdx.x == 0) {
        uint32_t ready = 0;
        while (true) {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(ready) : "l"(masks_ready) : "memory");
          if (ready != 0) break;
          __nanosleep(256);
        }
      }
      __syncthreads();
    }
    const uint32_t* m = allowed + int64_t{row} * ((vocab + 31) / 32);
    for (int32_t v = threadIdx.x; v < vocab; v += kThreads) {
      if (!(__ldcg(m + v / 32) >> (v % 32) & 1u)) l[v] = -INFINITY;  // from L2: written after the kernel began
    }
    __syncthreads();
  }

  int32_t token = 0;
  // Greedy rows end here: kUnroll independent loads per thread in flight (the ties rule makes the order moot).
  ArgMax best{-INFINITY, vocab};
  constexpr int kUnroll = 8;
  for (int32_t base = 0; base < vocab; base += kThreads * kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t v = base + u * kThreads + threadIdx.x;
      x[u] = v < vocab ? l[v] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t v = base + u * kThreads + threadIdx.x;
      if (v < vocab) best = ArgMaxOp()(best, ArgMax{x[u], v});
    }
  }
  best = AllReduce<BlockReduceA>(tmp.a, best, ArgMaxOp(), &sa);
  if (best.index >= vocab) best.index = 0;  // every logit is -inf: nothing is allowed; fall back to id 0
  if (p.temperature == 0.f || !(best.value > -INFINITY)) {
    token = best.index;
  } else {
    const float mx = best.value;
    // The smallest finite logit bounds the threshold searches from below.
    float mn = FLT_MAX;
    for (int32_t v = threadIdx.x; v < vocab; v += kThreads) {
      if (l[v] > -INFINITY) mn = fminf(mn, l[v]);
    }
    mn = AllReduce<BlockReduceF>(tmp.f, mn, MinOp(), &sf);
    // top-k: the largest threshold with at least k logits at or above it.
    float lo_k = -INFINITY;
    if (p.top_k > 0 && p.top_k < vocab) {
      float lo = mn, hi = mx;
      for (int it = 0; it < kSearchSteps; ++it) {
        const float mid = 0.5f * lo + 0.5f * hi;  // no overflow at ±FLT_MAX
        int c = 0;
        for (int32_t v = threadIdx.x; v < vocab; v += kThreads) c += l[v] >= mid;
        c = AllReduce<BlockReduceI>(tmp.i, c, SumOp(), &si);
        if (c >= p.top_k)
          lo = mid;
        else
          hi = mid;
      }
      lo_k = lo;
    }
    auto weight = [&](float x) { return x >= lo_k ? expf((x - mx) / p.temperature) : 0.f; };
    float z = 0.f;
    for (int32_t v = threadIdx.x; v < vocab; v += kThreads) z += weight(l[v]);
    z = AllReduce<BlockReduceF>(tmp.f, z, SumOp(), &sf);
    // top-p: the largest threshold whose logits at or above it hold at least top_p of the mass.
    float lo_p = lo_k;
    if (p.top_p < 1.f) {
      float lo = fmaxf(lo_k, mn), hi = mx;
      for (int it = 0; it < kSearchSteps; ++it) {
        const float mid = 0.5f * lo + 0.5f * hi;  // no overflow at ±FLT_MAX
        float m = 0.f;
        for (int32_t v = threadIdx.x; v < vocab; v += kThreads) m += l[v] >= mid ? weight(l[v]) : 0.f;
        m = AllReduce<BlockReduceF>(tmp.f, m, SumOp(), &sf);
        if (m >= p.top_p * z)
          lo = mid;
        else
          hi = mid;
      }
      lo_p = lo;
    }
    // min-p: probability at least min_p times the largest (whose weight is 1).
    const float min_w = p.min_p;
    auto kept = [&](float x) {
      const float w = x >= lo_p ? weight(x) : 0.f;
      return w >= min_w ? w : 0.f;
    };
    // The token where the running mass, in id order, passes uniform × total.
    const int32_t per = (vocab + kThreads - 1) / kThreads;
    const int32_t b = threadIdx.x * per, e = min(vocab, b + per);
    double mine = 0;
    for (int32_t v = b; v < e; ++v) mine += kept(l[v]);
    double before = 0, total = 0;
    BlockScanD(tmp.d).ExclusiveSum(mine, before, total);
    __syncthreads();
    const double target = p.uniform * total;
    if (threadIdx.x == 0) si = -1;
    __syncthreads();
    if (target >= before && target < before + mine) {
      double run = before;
      for (int32_t v = b; v < e; ++v) {
        const float w = kept(l[v]);
        run += w;
        if (w > 0 && target < run) {
          si = v;
          break;
        }
      }
    }
    __syncthreads();
    token = si >= 0 ? si : best.index;  // rounding past the end: the most likely token
  }
  if (threadIdx.x == 0) {
    tokens[row] = token;
    if (reports) {
      float raw = l[token];
      for (int32_t e = pb; e < pe; ++e)
        if (penalty_tokens[e] == token) raw = penalty_raw[e];
      logprobs[row] = raw - log_z;
    }
  }
}

}  // namespace

cudaError_t SampleRows(float* logits, int32_t num_rows, int32_t vocab, const SamplingRowParams* params,
                       const int32_t* penalty_indptr, const int32_t* penalty_tokens, const int32_t* penalty_counts,
                       const uint8_t* penalty_flags, const float* penalty_bias, float* penalty_raw,
                       const uint32_t* allowed, int32_t* tokens, float* logprobs, int32_t* top_ids, float* top_logprobs,
                       cudaStream_t stream, const uint32_t* masks_ready) {
  if (num_rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  SampleRowsKernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab, params, penalty_indptr, penalty_tokens,
                                                      penalty_counts, penalty_flags, penalty_bias, penalty_raw, allowed,
                                                      tokens, logprobs, top_ids, top_logprobs, masks_ready);
  return cudaGetLastError();
}

}  // namespace inferd::kernels
