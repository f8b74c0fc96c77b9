// The transformer layer's small kernels, for bf16 and fp16 activations (T = __nv_bfloat16 or __half) with fp32
// arithmetic; each rounds where Hugging Face transformers rounds in that dtype, so greedy tokens agree.
// Raw pointers + sizes + stream in, cudaError_t out. AddRmsNorm, ActivateMul and RopeWriteKv launch as programmatic
// dependents (kernels/dependent_launch.cuh): on sm_90 each starts while the kernel before it drains and waits for
// it before touching memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// dst[i, :] = src[rows[i], :]. Embedding lookup (rows = token ids) and picking the rows that need logits.
// src: [*, cols], rows: [num_rows], dst: [num_rows, cols].
template <typename T>
cudaError_t GatherRows(const T* src, const int32_t* rows, T* dst, int64_t num_rows, int64_t cols, cudaStream_t stream);

// dst[i, :] = embed[id, :] for id = ids[i], or, where ids[i] < 0, id = sampled[-1 - ids[i]]: a token the step
// before this one sampled, still only on the device (engine: PendingToken). embed: [vocab, cols], ids:
// [num_rows], sampled: [rows of the step before], dst: [num_rows, cols]. scale ≠ 1: each element times scale
// rounded to T, the product rounded to T (Gemma's √hidden, as transformers multiplies in the model's dtype).
template <typename T>
cudaError_t EmbedTokens(const T* embed, const int32_t* ids, const int32_t* sampled, T* dst, int64_t num_rows,
                        int64_t cols, cudaStream_t stream, float scale = 1.f);

// residual += delta (rounded to T), then out = weight ⊙ normalize(residual). delta may be null (norm only).
// residual, delta, out: [rows, n]; weight: [n].
template <typename T>
cudaError_t AddRmsNorm(T* residual, const T* delta, const T* weight, T* out, int64_t rows, int64_t n, float eps,
                       cudaStream_t stream);

// The gate's activation in a gated MLP: SiLU (SwiGLU: Llama, Qwen, Phi) or GELU's tanh approximation (GeGLU:
// Gemma).
enum class GatedActivation { kSilu = 0, kGeluTanh = 1 };

// out[r, i] = act(gate_up[r, i]) · gate_up[r, inter + i], the activation rounded to T before the product.
// gate_up: [rows, 2 * inter], out: [rows, inter].
template <typename T>
cudaError_t ActivateMul(const T* gate_up, T* out, int64_t rows, int64_t inter, GatedActivation act,
                        cudaStream_t stream);

// x[i] = cap · tanh(x[i] / cap) over n fp32 values (Gemma 2's final_logit_softcapping on the logits); cap > 0.
cudaError_t SoftCap(float* x, int64_t n, float cap, cudaStream_t stream);

// The rotary embedding's options beyond the plain one: the leading rotary_dim of each head rotate (0: all of it;
// Phi-3's partial rotary); LongRoPE: positions from long_from on use inv_freq_long, and cos and sin are multiplied
// by mscale (before rounding to T); and per-head RMSNorm of every q and k head before the rotation (Qwen3, Gemma 3):
// the head's values normalized (fp32, norm_eps), rounded to T, times q_norm (q heads) or k_norm (k heads) of T,
// rounded to T.
struct RotaryOptions {
  int32_t rotary_dim = 0;
  const float* inv_freq_long = nullptr;  // [rotary_dim / 2]; null: inv_freq everywhere
  int32_t long_from = 0;
  float mscale = 1.f;
  const void* q_norm = nullptr;  // [head_dim] of T; null: no per-head norms
  const void* k_norm = nullptr;  // [head_dim] of T
  float norm_eps = 0.f;
};

// Rotary embedding (rotate-half convention; RotaryOptions) on the q and k heads of each qkv row, in place, then K and V
// of token t written to slot slots[t] of the paged cache. qkv: [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
// (q heads, k heads, v heads); positions, slots: [num_tokens]; inv_freq: [head_dim / 2] fp32 (rope scaling already
// applied); k_cache, v_cache: [num_slots, num_kv_heads, head_dim] of C: T, or __nv_fp8_e4m3 for an fp8 KV cache, which
// holds each rotated K value divided by k_scale and each V value divided by v_scale (fp32 division), rounded to nearest
// e4m3 and saturating at ±448. k_scale and v_scale: 1 for a cache of T.
template <typename T, typename C = T>
cudaError_t RopeWriteKv(T* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq, C* k_cache,
                        C* v_cache, int64_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                        float k_scale, float v_scale, cudaStream_t stream, const RotaryOptions& options = {});

}  // namespace inferd::kernels
