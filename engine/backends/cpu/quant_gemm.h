// The cpu backend's product of a few rows (2 to 31: decode steps of several streams) against GGUF weights in Q4_1, Q5_0
// or Q8_0 blocks, as stored. ggml's dot kernels (stored_matmul.h) take one weight row against one input row at a time,
// so each weight block is unpacked again for every input row and every output pays a horizontal sum; here a tile of
// up to 4 weight rows × 4 input rows shares each unpacked block and each loaded input block, with 8-bit dot products
// (AVX-512 VNNI where the CPU has it, else AVX2) into per-block int32 sums scaled into fp32. The inputs are quantized
// as ggml's dot kernels quantize them (Q8_0: a scale per 32 values, amax / 127), so a product equals ggml's up to the
// order of its fp32 sums. x86 only; elsewhere QuantGemmTakes is false.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backends/cpu/spin_pool.h"

namespace inferd {

// Rows of X quantized for QuantGemm: 32-value blocks, each int8 values, its scale and its scale × the values' sum.
struct QuantizedRows {
  std::vector<int8_t> values;  // [rows, blocks * 32]
  std::vector<float> scale;    // [rows, blocks]
  std::vector<float> scaled_sum;
  int64_t rows = 0, blocks = 0;
};

// What the kernels read of QuantizedRows (plain pointers: the kernels' translation units, compiled for other
// instruction sets, instantiate no library template, whose out-of-line copies the linker could pick for the rest).
struct QuantizedView {
  const int8_t* values;
  const float* scale;
  const float* scaled_sum;
  int64_t rows, blocks;
};

// Whether QuantGemm multiplies weights of this ggml type (GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0) on this CPU.
bool QuantGemmTakes(uint32_t ggml_type);

// x [m, k] fp32 into *out; k a multiple of 32.
void QuantizeRows(const float* x, int64_t m, int64_t k, QuantizedRows* out);

// Which kernels QuantGemm runs: the best this CPU has, or the AVX2 ones wherever they run (tests check both).
enum class QuantIsa { kBest, kAvx2 };

// y[i * ldy + r] = x_i · w_r for every row i of x and the weight rows `rows` (each `blocks` blocks of `ggml_type`),
// r < count; the weight rows split over the pool's threads in tiles.
void QuantGemm(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, const QuantizedRows& x, float* y,
               int64_t ldy, SpinPool& pool, QuantIsa isa = QuantIsa::kBest);

}  // namespace inferd
