// The cpu backend's fp32 vector loops that the compiler may not reorder by itself (a sum's order is part of its
// result): a dot product and y += a·x, in AVX2/FMA where the CPU has them (checked once, at run time: the binary
// stays x86-64), else in plain C++ over eight partial sums. Either order differs from a serial loop's by a few units
// in the last place; the serial loop's chain of dependent adds took a fifth of a 16-stream decode step.
#pragma once

#include <cstdint>

namespace inferd {

// The element type of the cpu backend's KV cache (engine.kv_cache_dtype): fp32, or 16 bits a value (IEEE half or
// bfloat16), which halves its memory; values are rounded to nearest-even as they are written and widened exactly as
// they are read, so the arithmetic stays fp32.
enum class KvElement { kFloat32, kFloat16, kBfloat16 };
int64_t KvElementBytes(KvElement e);
const char* KvElementName(KvElement e);  // float32, float16, bfloat16

// Σ a[i]·b[i], i < n.
float Dot(const float* a, const float* b, int64_t n);

// y[i] += alpha · x[i], i < n.
void Axpy(float alpha, const float* x, float* y, int64_t n);

// out[i] = act(gate[i]) · up[i], i < n, act SiLU (g · σ(g)) or GELU's tanh form (½ g (1 + tanh(√(2/π)(g + 0.044715
// g³))) = g · σ(2√(2/π)(g + 0.044715 g³)), which has no cancellation where tanh nears −1): both g · σ(z), in AVX2
// through a polynomial exp good to about 2 units in the last place, elsewhere through std::exp. The scalar
// std::tanh / std::exp loops had taken 8–11% of a Gemma 3 step (a 2,048-wide GELU a row a layer).
enum class Gated { kSilu, kGeluTanh };
void GatedMul(Gated act, const float* gate, const float* up, float* out, int64_t n);

// The same over a KV row of type e: Σ q[i]·k[i], and y[i] += alpha · v[i] (Dot and Axpy for kFloat32).
float DotKv(const float* q, const void* k, int64_t n, KvElement e);
void AxpyKv(float alpha, const void* v, float* y, int64_t n, KvElement e);

// n values into (StoreKv) or out of (LoadKv) a KV row of type e.
void StoreKv(const float* x, void* row, int64_t n, KvElement e);
void LoadKv(const void* row, float* y, int64_t n, KvElement e);

}  // namespace inferd
